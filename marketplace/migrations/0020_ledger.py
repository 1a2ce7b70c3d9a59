"""The ledger (docs/ledger.md): billed intervals as immutable rows, a worker's price history, pause/remove of
workers, archived jobs. Time billed before it (``Activation.billed_seconds``, at the activation's frozen price) is
carried over as one ``opening`` entry per activation, so balances start from what the pages showed."""

import django.db.models.deletion
import django.utils.timezone
from decimal import Decimal
from django.conf import settings
from django.db import migrations, models


def opening_entries(apps, schema_editor):
    Activation = apps.get_model("marketplace", "Activation")
    LedgerEntry = apps.get_model("marketplace", "LedgerEntry")
    PriceChange = apps.get_model("marketplace", "PriceChange")
    Worker = apps.get_model("marketplace", "Worker")
    for worker in Worker.objects.all().iterator():
        PriceChange.objects.create(worker=worker, price_per_hour=worker.price_per_hour, at=worker.created_at)
    rows = Activation.objects.filter(billed_seconds__gt=0).select_related("job", "worker")
    for activation in rows.iterator():
        seconds = Decimal(repr(activation.billed_seconds)).quantize(Decimal("0.000001"))
        amount = (seconds * activation.price_per_hour / 3600).quantize(Decimal("0.000000001"))
        LedgerEntry.objects.create(
            activation=activation, job=activation.job, worker=activation.worker,
            provider_id=activation.worker.provider_id, owner_id=activation.job.owner_id,
            worker_name=activation.worker.name, job_name=activation.job.name, state="opening",
            started_at=activation.started_at, at=activation.reported_at, seconds=seconds,
            rate=activation.price_per_hour, amount=amount)
        Activation.objects.filter(pk=activation.pk).update(billed_usd=amount)


class Migration(migrations.Migration):

    dependencies = [
        ('marketplace', '0019_job_spec'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name='activation',
            name='billed_usd',
            field=models.DecimalField(decimal_places=9, default=Decimal('0'), help_text='USD billed: the sum of its ledger entries, written with each (each interval at the rate then in force).', max_digits=20),
        ),
        migrations.AddField(
            model_name='job',
            name='archived_at',
            field=models.DateTimeField(blank=True, help_text='When its owner archived it: hidden from lists unless asked for; its ledger kept.', null=True),
        ),
        migrations.AddField(
            model_name='worker',
            name='paused_at',
            field=models.DateTimeField(blank=True, help_text='When its provider paused it: never activated until resumed (docs/ledger.md "Provider and owner controls").', null=True),
        ),
        migrations.AddField(
            model_name='worker',
            name='removed_at',
            field=models.DateTimeField(blank=True, help_text='When its provider removed it: its key revoked, hidden from lists; its history and ledger kept.', null=True),
        ),
        migrations.CreateModel(
            name='PriceChange',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('price_per_hour', models.DecimalField(decimal_places=4, max_digits=10)),
                ('at', models.DateTimeField(default=django.utils.timezone.now)),
                ('worker', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='prices', to='marketplace.worker')),
            ],
            options={
                'ordering': ['at', 'id'],
            },
        ),
        migrations.CreateModel(
            name='LedgerEntry',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('worker_name', models.CharField(max_length=100)),
                ('job_name', models.CharField(max_length=100)),
                ('state', models.CharField(help_text="What the site observed the worker do (billed states: installing, generating; 'opening' for time billed before the ledger existed).", max_length=16)),
                ('started_at', models.DateTimeField(help_text='Start of the interval.')),
                ('at', models.DateTimeField(db_index=True, help_text='End of the interval: when it was billed.')),
                ('seconds', models.DecimalField(decimal_places=6, max_digits=16)),
                ('rate', models.DecimalField(decimal_places=4, help_text='USD per hour in force for the interval.', max_digits=10)),
                ('amount', models.DecimalField(decimal_places=9, help_text='USD: seconds x rate / 3600.', max_digits=20)),
                ('activation', models.ForeignKey(null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='ledger', to='marketplace.activation')),
                ('job', models.ForeignKey(null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='ledger', to='marketplace.job')),
                ('owner', models.ForeignKey(null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='ledger', to=settings.AUTH_USER_MODEL)),
                ('provider', models.ForeignKey(null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='ledger', to='marketplace.provider')),
                ('worker', models.ForeignKey(null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='ledger', to='marketplace.worker')),
            ],
            options={
                'ordering': ['at', 'id'],
                'indexes': [models.Index(fields=['job', 'at'], name='marketplace_job_id_ec3786_idx'), models.Index(fields=['worker', 'at'], name='marketplace_worker__8a82ee_idx')],
            },
        ),
        migrations.RunPython(opening_entries, migrations.RunPython.noop),
    ]
