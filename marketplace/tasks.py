"""Celery tasks: another interface onto services. They take ids, load, call one service.

The only module of the asynchronous side that imports ``services``: services enqueue these tasks by name
(``services.base.enqueue_task``), and the scheduler (``scheduling``) only reads and decides.
"""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings

from . import services
from .infra import probes
from .models import Job
from .reads import scheduling

log = logging.getLogger(__name__)


@shared_task
def replan_job(job_id: int) -> int:
    """A job started or resumed: plan its pool now rather than at the next beat."""
    job = Job.objects.filter(pk=job_id).first()
    return 0 if job is None else _replan(job)


@shared_task
def provision_waiting_jobs() -> int:
    """A worker came online: offer it to running jobs, oldest first."""
    return replan_running_jobs()


@shared_task
def replan_running_jobs() -> int:
    """The low-frequency scheduler (beat): adjust every running job's active set with hysteresis."""
    probes.celery_alive()
    return sum(_replan(job) for job in Job.objects.filter(status=Job.Status.RUNNING).order_by("started_at"))


def replan(job: Job, *, now: float | None = None) -> scheduling.Replan | None:
    """Decide one re-plan of ``job`` (``scheduling.job_replan``) and carry it out (``services.job_replan_apply``)."""
    decision = scheduling.job_replan(job, now=now)
    if decision is None:
        return None
    services.job_replan_apply(job=job, activate=decision.activate, release=decision.release, reason=decision.reason,
                              calibrate=decision.calibrate, hysteresis=decision.hysteresis)
    if decision.activate or decision.release:
        log.info("job %s: %s", job.pk, decision.reason)
    return decision


def _replan(job: Job) -> int:
    before = job.activations.filter(ended_at=None).count()
    if services.job_budget_check(job=job):  # paused at its budget (its workers released): nothing to plan
        return before
    replan(job)
    return abs(job.activations.filter(ended_at=None).count() - before)


@shared_task
def expire_silent_workers() -> int:
    return services.expire_silent_workers()


@shared_task
def fold_worker_heartbeats() -> int:
    """Heartbeats kept in Redis into ``Worker.last_heartbeat``, and socket closes still queued (beat)."""
    return services.worker_heartbeats_fold()


@shared_task
def record_worker_closes() -> int:
    """Agent sockets that closed: sessions ended, workers offline, leases returned (coalesced, after the closes)."""
    return services.worker_closes_record()


@shared_task
def stall_silent_learners() -> int:
    """Jobs whose learner went silent stop billing their workers (status ``stalled``)."""
    return services.jobs_stall_silent_learners()


# The tokenizer's read has its own deadline and the decoding its own timeout (infra/job_tokenizer.py): the task's
# limits leave them room, above the default 60 s.
_DECODE_LIMIT_S = float(settings.ECHO2["AUDIT_TOKENIZER_READ_S"]) + 120


@shared_task(soft_time_limit=_DECODE_LIMIT_S, time_limit=_DECODE_LIMIT_S + 30)
def audit_texts_decode(job_id: int) -> int:
    """Text failures a learner reported: decoded by the site with the job's tokenizer (verified, refused, or
    consistent saying why)."""
    return services.audit_texts_decode(job_id=job_id)
