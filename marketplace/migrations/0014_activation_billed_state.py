"""Bill by reported state (issue 13). Activations from before it were billed from start to end: their bill is
kept as it was (``billed_seconds`` = their time so far), and an open one is billed by state from now on."""

import django.utils.timezone
from django.db import migrations, models


def keep_past_bills(apps, schema_editor):
    Activation = apps.get_model("marketplace", "Activation")
    now = django.utils.timezone.now()
    for activation in Activation.objects.all().iterator():
        end = activation.ended_at or now
        activation.billed_seconds = max(0.0, (end - activation.started_at).total_seconds())
        activation.reported_at = activation.state_since = end
        activation.save(update_fields=["billed_seconds", "reported_at", "state_since"])


class Migration(migrations.Migration):

    dependencies = [
        ('marketplace', '0013_job_vocab_size'),
    ]

    operations = [
        migrations.AddField(
            model_name='activation',
            name='billed_seconds',
            field=models.FloatField(default=0.0, help_text='Seconds billed: installing and generating time its agent reported, up to its last report (or the end).'),
        ),
        migrations.AddField(
            model_name='activation',
            name='reported_at',
            field=models.DateTimeField(default=django.utils.timezone.now, help_text='The last state report: time is billed up to here.'),
        ),
        migrations.AddField(
            model_name='activation',
            name='state',
            field=models.CharField(choices=[('loading', 'Loading'), ('installing', 'Installing'), ('generating', 'Generating'), ('idle', 'Idle'), ('failed', 'Failed')], default='loading', help_text='What the agent last reported doing for the job (a new activation loads).', max_length=16),
        ),
        migrations.AddField(
            model_name='activation',
            name='state_reason',
            field=models.CharField(blank=True, help_text='Why the state is failed, if it is.', max_length=200),
        ),
        migrations.AddField(
            model_name='activation',
            name='state_since',
            field=models.DateTimeField(default=django.utils.timezone.now, help_text='When the agent entered ``state``.'),
        ),
        migrations.RunPython(keep_past_bills, migrations.RunPython.noop),
    ]
