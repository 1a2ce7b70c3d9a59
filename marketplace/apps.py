from pathlib import Path

from django.apps import AppConfig


class MarketplaceConfig(AppConfig):
    name = "marketplace"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.conf import settings

        from dataplane.tasks import files


        # The site reads task data only under its root and up to its cap; learners and agents are not Django.
        files.configure(files.TaskFiles(root=Path(settings.ECHO2["TASK_DATA_ROOT"]),
                                        max_bytes=int(settings.ECHO2["TASK_DATA_MAX_BYTES"])))
