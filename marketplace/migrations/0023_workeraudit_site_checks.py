"""The site's own check of each reported audit failure (docs/trust.md "Audits the site checks"). Failures reported
before it were never checked by the site: they become unverified (shown, not counted); a worker already suspended
stays suspended until staff lift it."""

from django.db import migrations, models


def unchecked_before(apps, schema_editor):
    apps.get_model("marketplace", "WorkerAudit").objects.update(failed_unverified=models.F("failed"))


class Migration(migrations.Migration):

    dependencies = [
        ('marketplace', '0022_job_samples'),
    ]

    operations = [
        migrations.AlterField(
            model_name='workeraudit',
            name='evidence',
            field=models.JSONField(blank=True, default=list, help_text="What was checked: per failed (and a few passed) groups, the entry and group, claimed against recomputed reward and log-prob, the texts that differ (learner/audit.py Verdict); each failure with the site's own check of it (site, site_reason: marketplace/core/audit_checks.py)."),
        ),
        migrations.AddField(
            model_name='workeraudit',
            name='failed_verified',
            field=models.PositiveIntegerField(default=0, help_text='Failures the site re-scored itself and confirmed (wrong rewards): counted toward suspension.'),
        ),
        migrations.AddField(
            model_name='workeraudit',
            name='failed_consistent',
            field=models.PositiveIntegerField(default=0, help_text='Log-prob or text failures whose evidence matches the stored group, not recomputable at the site: counted only when learners of several owners report such.'),
        ),
        migrations.AddField(
            model_name='workeraudit',
            name='failed_unverified',
            field=models.PositiveIntegerField(default=0, help_text='Failures the site could not check (record gone, no evidence, a user-code task): shown, never counted.'),
        ),
        migrations.AddField(
            model_name='workeraudit',
            name='failed_refused',
            field=models.PositiveIntegerField(default=0, help_text='Failures whose evidence does not match the stored group (a forged report): logged, never counted.'),
        ),
        migrations.RunPython(unchecked_before, migrations.RunPython.noop),
    ]
