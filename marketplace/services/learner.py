"""What the learner reports to the site: its announcement (``T_train``, relay address) and each step's metrics; and its
door to the job's streams (a Redis user of its own, ``infra.learner_door``). Its snapshot publications are
broadcast's (``broadcast.snapshot_publish``)."""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from dataplane.records import MAX_REWARD_ERRORS, RewardErrors
from dataplane.replay import RedisError

from ..infra import learner_door, liveness, reward_errors
from ..models import Job, JobMetric
from .audits import audits_record
from .base import ServiceError, enqueue_task, learner_may_report, push_job_update, pushes_together
from .budgets import job_budget_check
from .samples import samples_record
from .workers import worker_release

log = logging.getLogger(__name__)


@transaction.atomic
def learner_announce(*, job: Job, t_train: float | None, relay_address: str | None = None,
                     vocab_size: int | None = None) -> Job:
    """The learner is alive (its announcement and its periodic heartbeat): a job it had stalled runs again.
    Its announcement also says the model's ``vocab_size``, which the site checks returned token ids against."""
    job.learner_seen_at = timezone.now()
    fields = ["learner_seen_at"]
    _unstall(job, fields)
    for name, value in (("learner_t_train", t_train), ("learner_relay", relay_address), ("vocab_size", vocab_size)):
        if value is not None:
            setattr(job, name, value)
            fields.append(name)
    job.save(update_fields=fields)
    _door_restore(job)
    return job


LET_IN = (Job.Status.RUNNING, Job.Status.PAUSED, Job.Status.STALLED)  # a learner may train the job (learner/trainer.py)


@transaction.atomic
def learner_streams_open(*, job: Job) -> learner_door.LearnerDoor:
    """A learner starts: a fresh door to the job's streams (its Redis user with a new password; a learner still
    holding the old one is cut off). Raises ``RedisError`` when the streams' Redis does not answer."""
    job = Job.objects.select_for_update(no_key=True).get(pk=job.pk)
    if job.status not in LET_IN:
        raise ServiceError(f"status: job is {job.status}; a learner is let in only while the job runs, is paused or "
                           "stalled (start or resume it first)")
    door, digest = learner_door.door_open(job.pk)
    job.learner_redis_password_sha256 = digest
    job.save(update_fields=["learner_redis_password_sha256"])
    return door


def _door_restore(job: Job) -> None:
    """Its learner is alive: its Redis user exists (set again from its hash if Redis lost it in a restart). Called
    after the announcement's update locked the job's row, and read afresh under that lock: a job ended meanwhile has
    no door to restore, and one ending now waits for this to commit before it deletes the user."""
    status, digest = Job.objects.filter(pk=job.pk).values_list("status", "learner_redis_password_sha256")[0]
    if not digest or status not in LET_IN:
        return
    try:
        learner_door.door_restore(job.pk, digest)
    except RedisError as err:
        log.warning("job %s: could not check its learner's Redis user (Redis: %s)", job.pk, err)


@transaction.atomic
def metrics_record(*, job: Job, step: int, values: dict[str, Any]) -> JobMetric:
    learner_may_report(job)
    known = {f.name for f in JobMetric._meta.get_fields()} - {"id", "job", "step", "created_at", "extra"}
    values = dict(values)
    audits_record(job=job, step=step, results=values.pop("audits", None) or [])
    samples_record(job=job, step=step, rows=values.pop("samples", None) or [])
    extra = {**values.pop("extra", {}), **{k: v for k, v in values.items() if k not in known}}
    metric, created = JobMetric.objects.update_or_create(
        job=job, step=step, defaults={**{k: v for k, v in values.items() if k in known}, "extra": extra},
    )
    if created:  # a step report sent again counts once
        _learner_reward_errors(job, extra)
    Job.objects.filter(pk=job.pk).update(learner_step=step, learner_seen_at=timezone.now())
    job.refresh_from_db()
    if job.status == Job.Status.STALLED:
        fields: list[str] = []
        _unstall(job, fields)
        job.save(update_fields=fields)
    job_budget_check(job=job)  # paused before the next step would pass its budget
    push_job_update(job)
    return metric


def _learner_reward_errors(job: Job, extra: dict[str, Any]) -> None:
    """The owner's reward functions the learner scores (learner/scoring.py) failed on ``extra["reward_errors"]``
    records this step: counted with the workers' (the job page's and ``echo2 job status``'s reward function errors)."""
    count, last = extra.get("reward_errors"), extra.get("reward_last_error")
    if type(count) is not int or count <= 0:
        return
    text = last.replace("\x00", "")[:200] if isinstance(last, str) else ""
    for start in range(0, count, MAX_REWARD_ERRORS):  # one count of a step may exceed one group's bound
        reward_errors.record(job.pk, RewardErrors(errors=min(MAX_REWARD_ERRORS, count - start), last_error=text))


def _unstall(job: Job, fields: list[str]) -> None:
    """A stalled job whose learner is heard from again runs again; the scheduler activates a pool at once."""
    if job.status != Job.Status.STALLED:
        return
    job.status, job.status_reason, job.reason_code = Job.Status.RUNNING, "", Job.Reason.NONE
    fields += ["status", "status_reason", "reason_code"]
    log.info("job %s: its learner is back; running again", job.pk)
    enqueue_task("replan_job", job.pk)
    push_job_update(job)


@pushes_together()
@transaction.atomic
def jobs_stall_silent_learners() -> int:
    """Running jobs whose learner has not been heard from for ``LEARNER_TIMEOUT_S`` (since the job started,
    if it never was) turn ``stalled``: their workers are released, so nobody is billed for rollouts no
    learner will train. The learner's next announcement, heartbeat or report runs the job again.

    Silence is judged only over time the site was up (``liveness.site_up_since``: since its last outage, as its
    agents' heartbeats show): a learner cannot report to a site that is down, and a job is not stalled because
    the site was. Until the site has been up for ``LEARNER_TIMEOUT_S``, no job is stalled."""
    cutoff = timezone.now() - timezone.timedelta(seconds=settings.ECHO2["LEARNER_TIMEOUT_S"])
    try:
        up_since = liveness.site_up_since()
    except RedisError as err:
        log.warning("site up time unknown (Redis: %s); judging learners' silence over all of it", err)
        up_since = None
    if up_since is not None and up_since > cutoff.timestamp():
        return 0
    silent = Job.objects.select_for_update(no_key=True).filter(status=Job.Status.RUNNING).filter(
        Q(learner_seen_at__lt=cutoff) | Q(learner_seen_at=None, started_at__lt=cutoff))
    count = 0
    for job in silent:
        since = job.learner_seen_at or job.started_at
        job.status = Job.Status.STALLED
        job.status_reason = f"the learner has been silent since {since:%Y-%m-%d %H:%M:%S} UTC"
        job.reason_code = Job.Reason.LEARNER_SILENT
        job.save(update_fields=["status", "status_reason", "reason_code"])
        for activation in job.activations.filter(ended_at=None):
            worker_release(activation=activation, reason="the job's learner is silent")
        log.warning("job %s: stalled: %s", job.pk, job.status_reason)
        push_job_update(job)
        count += 1
    return count
