"""A job's life (create, start, pause, resume, finish) and its pool of workers: the calibration phase's
"every idle worker", and the scheduler's decisions (``scheduling.job_replan``) carried out."""

from __future__ import annotations

import logging
from collections.abc import Collection

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from dataplane.jobs import JobSpec, model_dir_problem
from dataplane.replay import RedisError

from ..infra import learner_door, stream
from ..models import Activation, Job, Worker
from ..reads import ledger, matching, selectors
from .base import ServiceError, enqueue_task, push_job_update, pushes_together
from .datasets import datasets_check
from .workers import workers_activate, workers_release

log = logging.getLogger(__name__)


def check_model_dir(model_dir: str) -> None:
    """Refuse a ``model_dir`` that is not a checkpoint directory where the site can see the learner's paths
    (``ECHO2_CHECK_MODEL_DIR``; ``JobSpec`` has already refused anything but an absolute path)."""
    problem = model_dir_problem(model_dir) if settings.ECHO2["CHECK_MODEL_DIR"] else None
    if problem:
        raise ServiceError(f"model_dir: {problem} (model_dir is the base checkpoint directory on the learner's "
                           "machine)")


@transaction.atomic
def job_create(*, owner, spec: JobSpec) -> Job:
    check_model_dir(spec.model_dir)
    datasets_check(owner=owner, spec=spec)
    job = Job.from_spec(spec, owner=owner)
    job.save(force_insert=True)
    return job


@transaction.atomic
def job_start(*, job: Job) -> Job:
    """Start a draft job; its pool is planned at once (task ``replan_job``) rather than at the next beat."""
    if job.status != Job.Status.DRAFT:
        raise ServiceError(f"status: job is {job.status}; only a draft job can be started")
    check_model_dir(job.model_dir)
    job.status = Job.Status.RUNNING
    job.started_at = timezone.now()
    job.save(update_fields=["status", "started_at"])
    stream.replay(job.pk).ensure_groups()
    enqueue_task("replan_job", job.pk)
    push_job_update(job)
    return job


@pushes_together()
@transaction.atomic
def job_finish(*, job: Job, status: str, reason: str = "", code: str = Job.Reason.NONE) -> Job:
    """End a job (completed, failed or cancelled) and release its workers; ``reason`` says why in words, ``code``
    (``Job.Reason``) as a code.

    A failed job is not final: it keeps its streams (groups returned and not yet trained, entries trained
    since the last checkpoint) so that :func:`job_resume` can continue it from the learner's checkpoint, and
    it can still be cancelled. A completed or cancelled job's streams are dropped.
    """
    if status not in Job.TERMINAL:
        raise ServiceError(f"status: must be one of {', '.join(sorted(Job.TERMINAL))}")
    if job.is_terminal and not (job.status == Job.Status.FAILED and status == Job.Status.CANCELLED):
        raise ServiceError(f"status: job already {job.status}")
    job.status, job.status_reason, job.reason_code = status, reason[:500], code
    job.finished_at = timezone.now()
    # Its learner is let out (a resumed job's learner gets a new door). Read under the row's lock: a door opened
    # since ``job`` was read is closed too, and a heartbeat cannot set the user again once this commits.
    locked = Job.objects.select_for_update(no_key=True).filter(pk=job.pk)
    if locked.values_list("learner_redis_password_sha256", flat=True)[0]:
        transaction.on_commit(lambda: learner_door.door_close(job.pk))
    job.learner_redis_password_sha256 = ""
    job.save(update_fields=["status", "status_reason", "reason_code", "finished_at", "learner_redis_password_sha256"])
    workers_release(job_id=job.pk, activations=list(job.activations.filter(ended_at=None).order_by("worker_id")),
                    reason=f"job {status}", return_leases=status == Job.Status.FAILED)  # a failed job keeps streams
    if status != Job.Status.FAILED:
        transaction.on_commit(lambda: _drop_streams(job.pk))
    push_job_update(job)
    return job


@pushes_together()
@transaction.atomic
def job_pause(*, job: Job, by: str = "", reason: str = "", code: str = Job.Reason.NONE) -> Job:
    """Stop generation (and billing) for a running job without losing anything. Why: ``reason`` in words (default:
    paused by ``by``), ``code`` as a code (``Job.Reason``; default: by a person when ``by`` names one).

    Its workers are released; the prompt and trajectory streams stay. Trajectories already queued are
    still trained (the learner keeps reporting while paused), leases in flight expire and their prompts
    are re-leased after :func:`job_resume`. The learner waits instead of failing for lack of data.
    """
    if job.status != Job.Status.RUNNING:
        raise ServiceError(f"status: job is {job.status}; only a running job can be paused")
    job.status = Job.Status.PAUSED
    job.status_reason = (reason or (f"paused by {by}" if by else "paused"))[:500]
    job.reason_code = code or (Job.Reason.BY_PERSON if by else Job.Reason.NONE)
    job.save(update_fields=["status", "status_reason", "reason_code"])
    workers_release(job_id=job.pk, activations=list(job.activations.filter(ended_at=None).order_by("worker_id")),
                    reason="job paused")
    push_job_update(job)
    return job


@transaction.atomic
def job_resume(*, job: Job) -> Job:
    """Back to running: the scheduler activates a pool at once (task ``replan_job``).

    A failed job (its learner gave up: Redis or the site gone too long, no data) resumes too: its learner,
    started again, continues from its last checkpoint and the streams the job kept.
    """
    if job.status not in (Job.Status.PAUSED, Job.Status.FAILED):
        raise ServiceError(f"status: job is {job.status}; only a paused or failed job can be resumed")
    if problem := ledger.budget_problem(job):
        raise ServiceError(f"budget_usd: {problem}")
    job.status, job.status_reason, job.reason_code = Job.Status.RUNNING, "", Job.Reason.NONE
    job.finished_at = None
    job.save(update_fields=["status", "status_reason", "reason_code", "finished_at"])
    stream.replay(job.pk).ensure_groups()
    enqueue_task("replan_job", job.pk)
    push_job_update(job)
    return job


@pushes_together()
@transaction.atomic
def job_activate_idle_workers(*, job: Job) -> list[Activation]:
    """Activate every idle worker that meets the job's requirements (``matching``) for a running job.

    This is the calibration phase (the learner has not measured ``T_train`` yet, so no target exists and
    every worker's ``mu_i`` for this model gets measured) and the answer when no pool can keep up. Once
    a target exists, ``scheduling.job_replan`` decides with hysteresis instead.
    """
    if job.status != Job.Status.RUNNING:
        return []
    busy = Activation.objects.filter(ended_at=None).values("worker_id")
    idle = [worker
            for worker in Worker.objects.filter(status=Worker.Status.IDLE, suspended_at__isnull=True, paused_at=None,
                                                 removed_at=None)
            .exclude(pk__in=busy).exclude(pk__in=selectors.excluded_workers(job))]
    qualify = set(matching.match_workers(matching.needs_of(job.settings)[0], idle).qualify)
    return workers_activate(job=job, workers=[worker for worker in idle if worker.pk in qualify])


@pushes_together()
@transaction.atomic
def job_replan_apply(*, job: Job, activate: Collection[int] = (), release: Collection[int] = (), reason: str = "",
                     calibrate: bool = False, hysteresis: tuple[float | None, float | None] | None = None) -> None:
    """Carry out one re-plan that ``scheduling.job_replan`` decided, in one transaction: the activations
    (``activate``, or with ``calibrate`` every idle worker), the releases, and the scheduler's hysteresis
    clocks ``(below_since, above_since)`` that the decision moved (None: unchanged). The decision was read
    outside this transaction: nothing is done when the job stopped running since, and a worker another job
    took meanwhile is skipped.
    """
    job = Job.objects.select_for_update(no_key=True).get(pk=job.pk)
    if job.status != Job.Status.RUNNING:
        return
    if hysteresis is not None:
        job.hysteresis_below_since, job.hysteresis_above_since = hysteresis
        job.save(update_fields=["hysteresis_below_since", "hysteresis_above_since"])
    if calibrate:
        job_activate_idle_workers(job=job)
    busy = Activation.objects.filter(ended_at=None).values("worker_id")
    # one suspended, paused or out of user code since the decision was read is left out (and logged)
    workers_activate(job=job, workers=list(Worker.objects.filter(pk__in=list(activate)).exclude(pk__in=busy)))
    surplus = list(job.activations.filter(ended_at=None, worker_id__in=list(release)).order_by("worker_id"))
    workers_release(job_id=job.pk, activations=surplus, reason=f"capacity above target: {reason}")


def _drop_streams(job_id: int) -> None:
    """Forget an ended job's streams, after the commit; Redis being away must not turn the finished job
    into an error for the caller (the streams then stay until someone deletes them)."""
    try:
        stream.replay(job_id).drop()
    except RedisError as err:
        log.warning("job %s: could not drop its streams (Redis: %s); they stay in Redis", job_id, err)
