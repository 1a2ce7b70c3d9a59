# A worker's user-code opt-in as its agent declares it in its hello (docs/trust.md "User code on workers"): matching
# leaves a worker whose provider did not opt in out of a job that names user code, before it is assigned.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("marketplace", "0023_workeraudit_site_checks"),
    ]

    operations = [
        migrations.AddField(
            model_name="worker",
            name="allow_user_code",
            field=models.BooleanField(blank=True, help_text="Whether its provider runs job owners' code on it (echo2-agent run --allow-user-code), as its last hello said; null: its agent never said (older), matched as before and refuses such a job itself if it does not.", null=True),
        ),
    ]
