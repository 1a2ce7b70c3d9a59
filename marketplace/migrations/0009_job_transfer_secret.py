"""Job.transfer_secret: one fresh random secret per job, existing jobs included (a field default would give
every existing row the same one)."""

from django.db import migrations, models

import dataplane.credentials


def fill_secrets(apps, schema_editor):
    Job = apps.get_model("marketplace", "Job")
    for job in Job.objects.filter(transfer_secret="").only("pk"):
        job.transfer_secret = dataplane.credentials.new_secret()
        job.save(update_fields=["transfer_secret"])


class Migration(migrations.Migration):

    dependencies = [
        ("marketplace", "0008_job_hysteresis"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="transfer_secret",
            field=models.CharField(default="", editable=False, max_length=64),
            preserve_default=False,
        ),
        migrations.RunPython(fill_secrets, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="job",
            name="transfer_secret",
            field=models.CharField(default=dataplane.credentials.new_secret, editable=False,
                                   help_text="Signs this job's weight-transfer credentials; never shown.",
                                   max_length=64),
        ),
    ]
