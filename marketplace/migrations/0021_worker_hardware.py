# The hardware a worker's agent measured (dataplane/hardware.py), stored as facts for matching (issue 29).

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("marketplace", "0020_ledger"),
    ]

    operations = [
        migrations.AddField(
            model_name="worker",
            name="hardware",
            field=models.JSONField(blank=True, default=dict, help_text="What the machine has, as its agent measured it at registration and in its last hello (dataplane.hardware.Hardware); claims used only for matching jobs' requirements. Empty: never reported."),
        ),
        migrations.AddField(
            model_name="worker",
            name="hardware_at",
            field=models.DateTimeField(blank=True, help_text="When the agent last reported its hardware.", null=True),
        ),
    ]
