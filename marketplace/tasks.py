"""Celery tasks: another interface onto services. They take ids, load, call one service."""

from __future__ import annotations

from celery import shared_task

from . import services
from .models import Job


@shared_task(bind=True, max_retries=3, default_retry_delay=2)
def provision_job(self, job_id: int) -> int:
    job = Job.objects.filter(pk=job_id).first()
    if job is None:
        return 0
    return len(services.job_provision(job=job))


@shared_task
def provision_waiting_jobs() -> int:
    """Offer newly idle workers to running jobs, oldest job first."""
    total = 0
    for job in Job.objects.filter(status=Job.Status.RUNNING).order_by("started_at"):
        total += len(services.job_provision(job=job))
    return total


@shared_task
def replan_running_jobs() -> int:
    return provision_waiting_jobs()


@shared_task
def expire_silent_workers() -> int:
    return services.expire_silent_workers()
