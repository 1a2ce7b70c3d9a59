"""The rollout loop: an active worker leases prompt groups and returns each as one ``TrajectoryGroup``,
which goes to the learner's stream whole or not at all (``dataplane.replay``)."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import time

from django.conf import settings
from django.db.models import Sum

from dataplane import messages as m
from dataplane.chat import as_prompt_format
from dataplane.records import RecordError, RecordLimits, TrajectoryGroup
from dataplane.replay import LeaseError, RedisError
from dataplane.tasks import TaskSpecError, build_task

from ..infra import group_seal, reward_errors, stream, telemetry
from ..models import Activation, Job, Worker
from ..reads import selectors
from ..realtime.assembly import AssemblyError, GroupAssembler, JobLimits, group_bytes_bound
from .base import ServiceError, running_activation

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class RunningJob:
    """What checking a worker's leases and groups in one running job needs, read from the database once.

    The agent socket keeps one per connection (``marketplace.realtime.jobcache``) so that the hot path, a lease or a
    group, costs Redis round trips and no query: the ORM on every message was most of the site's time under
    load. It is only as fresh as its read: the socket drops it on every push that changes it
    (assign, release, snapshot) and after a short max age; whatever it misses, the lease script still refuses
    a group whose lease is not this worker's any more (a released worker's leases are handed back)."""

    job_id: int
    worker_id: int
    group_size: int
    published_version: int
    max_new_tokens: int
    limits: RecordLimits
    max_lease_groups: int = m.MAX_BATCH  # groups one lease may take (:func:`lease_cap`)


def running_job(*, worker: Worker, job_id: int) -> RunningJob:
    """The worker's running job ``job_id`` as the checks need it; :class:`ServiceError` when the worker is not
    active in it or the job is not running (``running_activation``)."""
    job = running_activation(worker, job_id).job
    return RunningJob(job_id=job.pk, worker_id=worker.pk, group_size=job.group_size,
                      published_version=job.published_version, max_new_tokens=job.max_new_tokens,
                      limits=record_limits(job), max_lease_groups=lease_cap(job))


def lease_cap(job: Job) -> int:
    """The most prompt groups one lease takes: one learner step's groups (``R / n``, at least 1). A fast agent
    batches to save messages (``worker_agent/rollout_loop.py``), but every group of a batch is generated under one
    version and waits in the stream behind the others: a lease of several steps' groups would age past the
    staleness budget ``S`` before the learner reached its last group, and starve the other workers of prompts."""
    return max(1, job.batch_trajectories // max(1, job.group_size))


def _checked(worker: Worker, job_id: int, running: RunningJob | None) -> RunningJob:
    """``running`` when it is this worker's job ``job_id``, else the job read now."""
    if running is not None and running.job_id == job_id and running.worker_id == worker.pk:
        return running
    return running_job(worker=worker, job_id=job_id)


def prompts_lease(*, worker: Worker, job_id: int, groups: int, running: RunningJob | None = None) -> m.Lease | m.NoWork:
    """Lease up to ``groups`` prompt groups to the worker. ``running``: the job as the caller last read it
    (:func:`running_job`); without it the activation is read now."""
    job = _checked(worker, job_id, running)
    timeout = settings.ECHO2["LEASE_TIMEOUT_S"]
    count = min(groups, job.max_lease_groups)
    leased = stream.replay(job_id).lease(worker_id=worker.pk, count=count, timeout_s=timeout)
    if not leased:
        _starved(worker.pk, job_id, now=time.time())
        return m.NoWork(job_id=job_id, retry_after=0.2)
    try:  # the prompts are leased: a figure lost to Redis must not lose the lease's reply (they would wait 30 s)
        telemetry.record_observed(worker.pk, job_id=job_id, what="leased", at=time.time())  # it is working: billed
    except RedisError as err:
        log.warning("worker %s: a lease of job %s not recorded for billing (Redis: %s)", worker.pk, job_id, err)
    return m.Lease(job_id=job_id, timeout=timeout, leases=[
        m.LeasedPrompt(lease_id=g.lease_id, group_id=g.group_id, prompt=g.prompt) for g in leased
    ])


STARVED_EVERY_S = 5.0
UNLEASED_RETRY_AFTER_S = 2.0  # a lease that failed after its submit's groups were judged is asked again this late
_starved_written: dict[tuple[int, int], float] = {}  # (worker, job) -> when this process last wrote it
EARNINGS_EVERY_S = 10.0  # the agent prints a summary every 10 s by default (--status-every)
_earned: dict[int, tuple[float, float]] = {}  # worker -> (when this process summed it, the sum)


def _starved(worker_id: int, job_id: int, *, now: float) -> None:
    """The worker asked for work and the job had none: not silent (``billing.silent_reason``), not billed either.
    Written at most every ``STARVED_EVERY_S`` per worker and process: an idle agent asks several times a second."""
    if now - _starved_written.get((worker_id, job_id), 0.0) >= STARVED_EVERY_S:
        _starved_written[(worker_id, job_id)] = now
        telemetry.record_observed(worker_id, job_id=job_id, what="starved", at=now)


def trajectories_submit(*, worker: Worker, group: TrajectoryGroup, running: RunningJob | None = None) -> m.Accepted:
    """Check a returned group against its job and lease and append it to the learner's stream, all or nothing.

    The group's schema and group rules were checked when its message was parsed (``TrajectoryGroup``).
    A group that does not fit is refused whole (GRPO needs whole groups); its lease stays open, so the
    prompt is re-leased after the timeout and nothing is lost. ``running``: as for :func:`prompts_lease`.
    The accepted records are counted for the worker's measured mu_i in the same Redis round trip, and the entry
    carries the site's seal (``dataplane.seal``): what an audit of it later believes (``services.audit_verify``).
    """
    job = _checked(worker, group.job_id, running)
    buffer = stream.replay(group.job_id)
    n = len(group.records)
    try:
        group.check_for_job(job_id=job.job_id, group_size=job.group_size, max_version=job.published_version,
                            limits=job.limits)
        stored = buffer.return_group(worker_id=worker.pk, group=group, seal_key=group_seal.signing_key(),
                                     event=telemetry.accepted_event(worker.pk, job_id=job.job_id, at=time.time(),
                                                                    records=n))
    except (RecordError, LeaseError) as err:
        buffer.count("rejected_records", n)
        return m.Accepted(job_id=group.job_id, lease_id=group.lease_id, accepted=0, rejected=n, reasons=[str(err)])
    if group.reward_errors is not None and not stored.resent:  # counted once: a resend finds its group stored
        reward_errors.record(job.job_id, group.reward_errors)
    return m.Accepted(job_id=group.job_id, lease_id=group.lease_id, accepted=n, rejected=0)


def groups_submit(*, worker: Worker, job_id: int, groups: list[TrajectoryGroup], lease: int = 0,
                  running: RunningJob | None = None, earned_usd: float | None = None) -> m.Submitted:
    """A batch of answered leases, each checked and appended on its own (:func:`trajectories_submit`: one bad group
    does not sink the others), then ``lease`` more groups leased in the same round trip (:func:`prompts_lease`).
    The answer carries what the worker has earned (``earned_usd``, else :func:`worker_earned_usd`: a query when
    due, so a caller off the database thread reads it there first), for its agent's status line."""
    job = _checked(worker, job_id, running)
    results = [trajectories_submit(worker=worker, group=group, running=job) for group in groups]
    try:
        if any(result.accepted for result in results):  # visibly working: its other leases are not taken from it
            stream.replay(job_id).renew(worker_id=worker.pk, timeout_s=settings.ECHO2["LEASE_TIMEOUT_S"])
        leased = prompts_lease(worker=worker, job_id=job_id, groups=lease, running=job) if lease else None
    except RedisError as err:
        if not groups:
            raise  # nothing judged yet: the request as a whole is sent again
        # The groups' verdicts stand (stored groups are accepted, whatever fails after); the lease is asked again.
        log.warning("worker %s: lease of job %s after its groups failed (Redis: %s)", worker.pk, job_id, err)
        leased = m.NoWork(job_id=job_id, retry_after=UNLEASED_RETRY_AFTER_S)
    return m.Submitted(job_id=job_id, results=results, lease=leased,
                       earned_usd=worker_earned_usd(worker.pk, now=time.monotonic()) if earned_usd is None
                       else earned_usd)


def worker_earned_usd(worker_id: int, *, now: float) -> float:
    """What the ledger has billed for the worker so far, USD, every job: the sum of its activations' ledger sums
    (``Activation.billed_usd``), read again at most every ``EARNINGS_EVERY_S`` per worker and process (an agent
    submits several times a second; its status line prints every few seconds). A query when due: call it where
    database connections are looked after (the agent socket's database thread), not from a plain worker thread,
    where the connection would stay checked out of the pool for good."""
    value = worker_earned_usd_held(worker_id, now=now)
    if value is None:
        value = float(Activation.objects.filter(worker_id=worker_id).aggregate(total=Sum("billed_usd"))["total"] or 0)
        _earned[worker_id] = (now, value)
    return value


def worker_earned_usd_held(worker_id: int, *, now: float) -> float | None:
    """What :func:`worker_earned_usd` read less than ``EARNINGS_EVERY_S`` ago; None when it is due again. No query."""
    at, value = _earned.get(worker_id, (None, 0.0))
    return value if at is not None and now - at < EARNINGS_EVERY_S else None


def record_limits(job: Job) -> RecordLimits:
    """What a record of ``job`` may hold: its task's reward range and completion budget, the tokens its prompt
    format adds to a prompt (a chat template), and its model's vocabulary once the learner reported it (until then
    token ids are checked by the learner alone).
    A task this site cannot build any more (its data file gone) keeps only the generic, float32-safe bounds."""
    spec = json.dumps(job.task, sort_keys=True)
    try:
        limits = _task_limits(spec, job.max_new_tokens)
    except TaskSpecError as err:
        log.warning("job %s: cannot build its task to check records (%s); checking the generic bounds", job.pk, err)
        limits = RecordLimits()
    return dataclasses.replace(limits, vocab_size=job.vocab_size,
                               max_metadata_bytes=settings.ECHO2["MAX_RECORD_METADATA_BYTES"],
                               prompt_extra_tokens=as_prompt_format(job.prompt_format).token_allowance())


@functools.lru_cache(maxsize=256)
def _task_limits(task_spec: str, max_new_tokens: int) -> RecordLimits:
    """The task's part of the limits, built once per (task, budget): building a task may read a data file."""
    return build_task(json.loads(task_spec)).record_limits(max_new_tokens=max_new_tokens, vocab_size=None)


def trajectories_malformed(*, worker: Worker, job_id: object, records: object) -> None:
    """Count the records of a ``trajectories`` message whose group failed its schema, when it names a job
    this worker is active in (the reply is the parse error)."""
    if not isinstance(job_id, int) or selectors.active_activation(worker=worker, job_id=job_id) is None:
        return
    stream.replay(job_id).count("rejected_records", len(records) if isinstance(records, list) else 1)


def trajectories_part_submit(*, worker: Worker, assembler: GroupAssembler, part: m.TrajectoriesPart,
                             frame_bytes: int, running: RunningJob | None = None) -> list[m.Accepted | m.Rejected]:
    """Join one part of a group too big for one frame (``marketplace/realtime/assembly.py``); after its last part,
    submit the whole group exactly as one sent in one frame. No reply while parts are still to come; a refused part
    drops the assembly with the reason (the lease stays open, so the prompt is leased again: nothing is lost)."""
    try:
        job = _checked(worker, part.group.job_id, running)
    except ServiceError:
        assembler.drop()
        raise
    limits = JobLimits(group_size=job.group_size, timeout_s=settings.ECHO2["LEASE_TIMEOUT_S"],
                       max_bytes=group_bytes_bound(group_size=job.group_size, max_new_tokens=job.max_new_tokens))
    try:
        group = assembler.add(part, frame_bytes=frame_bytes, limits=limits, now=time.monotonic())
    except AssemblyError as err:
        stream.replay(job.job_id).count("rejected_records", err.records)
        return [m.Rejected(reason=str(err), ref=part.type)]
    return [] if group is None else [trajectories_submit(worker=worker, group=group, running=job)]


def lease_return(*, worker: Worker, job_id: int, lease_id: str, reason: str) -> None:
    """Hand back a lease the worker cannot answer (a record too big for any frame): the prompt is leased again at
    once, to whoever asks next, instead of after the lease timeout. Counted as ``returned_leases``."""
    running_activation(worker, job_id)
    buffer = stream.replay(job_id)
    try:
        returned = buffer.return_leases(worker_id=worker.pk, lease_id=lease_id)
    except LeaseError as err:
        raise ServiceError(str(err)) from None
    if not returned:
        raise ServiceError(f"lease_id: {lease_id!r} is not leased to this worker")
    buffer.count("returned_leases")
    log.warning("worker %s handed back lease %s of job %s: %s", worker.pk, lease_id, job_id, reason)
