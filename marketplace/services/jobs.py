"""A job's life (create, start, pause, resume, finish) and the calibration phase's pool: every idle worker."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from dataplane.jobs import JobSpec

from .. import stream
from ..models import Activation, Job, Worker
from . import base
from .base import ServiceError
from .workers import worker_activate, worker_release


@transaction.atomic
def job_create(*, owner, spec: JobSpec) -> Job:
    return Job.objects.create(owner=owner, **spec.model_dump())


@transaction.atomic
def job_start(*, job: Job) -> Job:
    """Start a draft job; its pool is planned at once (task ``replan_job``) rather than at the next beat."""
    if job.status != Job.Status.DRAFT:
        raise ServiceError(f"status: job is {job.status}; only a draft job can be started")
    job.status = Job.Status.RUNNING
    job.started_at = timezone.now()
    job.save(update_fields=["status", "started_at"])
    stream.ensure_groups(job.pk)
    base.enqueue_task("replan_job", job.pk)
    base.push_job_update(job)
    return job


@transaction.atomic
def job_finish(*, job: Job, status: str, reason: str = "") -> Job:
    """End a job (completed, failed or cancelled), release its workers and drop its streams."""
    if status not in Job.TERMINAL:
        raise ServiceError(f"status: must be one of {', '.join(sorted(Job.TERMINAL))}")
    if job.is_terminal:
        raise ServiceError(f"status: job already {job.status}")
    job.status = status
    job.status_reason = reason[:500]
    job.finished_at = timezone.now()
    job.save(update_fields=["status", "status_reason", "finished_at"])
    for activation in job.activations.filter(ended_at=None):
        worker_release(activation=activation, reason=f"job {status}")
    transaction.on_commit(lambda: stream.drop_job(job.pk))
    base.push_job_update(job)
    return job


@transaction.atomic
def job_pause(*, job: Job, by: str = "") -> Job:
    """Stop generation (and billing) for a running job without losing anything.

    Its workers are released; the prompt and trajectory streams stay. Trajectories already queued are
    still trained (the learner keeps reporting while paused), leases in flight expire and their prompts
    are re-leased after :func:`job_resume`. The learner waits instead of failing for lack of data.
    """
    if job.status != Job.Status.RUNNING:
        raise ServiceError(f"status: job is {job.status}; only a running job can be paused")
    job.status = Job.Status.PAUSED
    job.status_reason = f"paused by {by}" if by else "paused"
    job.save(update_fields=["status", "status_reason"])
    for activation in job.activations.filter(ended_at=None):
        worker_release(activation=activation, reason="job paused")
    base.push_job_update(job)
    return job


@transaction.atomic
def job_resume(*, job: Job) -> Job:
    """Back to running: the scheduler activates a pool at once (task ``replan_job``)."""
    if job.status != Job.Status.PAUSED:
        raise ServiceError(f"status: job is {job.status}; only a paused job can be resumed")
    job.status = Job.Status.RUNNING
    job.status_reason = ""
    job.save(update_fields=["status", "status_reason"])
    stream.ensure_groups(job.pk)
    base.enqueue_task("replan_job", job.pk)
    base.push_job_update(job)
    return job


@transaction.atomic
def job_activate_idle_workers(*, job: Job) -> list[Activation]:
    """Activate every idle worker for a running job.

    This is the calibration phase (the learner has not measured ``T_train`` yet, so no target exists and
    every worker's ``mu_i`` for this model gets measured) and the answer when no pool can keep up. Once
    a target exists, ``scheduling.job_replan`` decides with hysteresis instead.
    """
    if job.status != Job.Status.RUNNING:
        return []
    busy = Activation.objects.filter(ended_at=None).values("worker_id")
    return [worker_activate(worker=worker, job=job)
            for worker in Worker.objects.filter(status=Worker.Status.IDLE).exclude(pk__in=busy)]

