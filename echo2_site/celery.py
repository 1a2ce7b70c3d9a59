"""The Celery app: configured from Django settings (CELERY_*), tasks discovered in each app."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "echo2_site.settings")

app = Celery("echo2_site")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
