"""The rollout loop: an active worker leases prompt groups and returns each as one ``TrajectoryGroup``,
which goes to the learner's stream whole or not at all (``dataplane.replay``)."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import time
from collections.abc import Sequence

from django.conf import settings
from django.db.models import Sum

from dataplane import messages as m
from dataplane.chat import as_prompt_format
from dataplane.records import RecordError, RecordLimits, RewardErrors, TrajectoryGroup
from dataplane.replay import LeasedPrompt, LeaseError, Submitted, return_error
from dataplane.tasks import TaskSpecError, build_task

from ..core.assembly import AssemblyError, GroupAssembler, JobLimits, group_bytes_bound
from ..infra import delivered, group_seal, reward_errors, stream, telemetry, verdicts
from ..models import Activation, Job, Worker
from ..reads import selectors
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
    return _running(running_activation(worker, job_id).job, worker_id=worker.pk)


@dataclasses.dataclass(frozen=True)
class JobAtWork:
    """A running job as every agent socket of a process may share it (``marketplace.realtime.jobcache.JOBS``): what
    checking leases and groups needs, and the workers active in it."""

    running: RunningJob  # its worker_id is 0: see :meth:`for_worker`
    active: frozenset[int]
    gamma: float = 1.0  # the job's safety factor: T_bcast is fixed once ceil(len(active) / gamma) workers installed
    base_published: bool = True  # its version 0 is out (before it, an agent's snapshot request has nothing to get)

    def for_worker(self, worker_id: int) -> RunningJob | None:
        """The worker's :class:`RunningJob`; None when it is not active in the job (:func:`running_job` says why)."""
        return dataclasses.replace(self.running, worker_id=worker_id) if worker_id in self.active else None


def job_at_work(*, job_id: int) -> JobAtWork | None:
    """Job ``job_id`` and the workers active in it, when it is running (two queries, whatever the fleet), else None."""
    job = Job.objects.filter(pk=job_id, status=Job.Status.RUNNING).first()
    if job is None:
        return None
    active = frozenset(Activation.objects.filter(job_id=job_id, ended_at=None).values_list("worker_id", flat=True))
    return JobAtWork(running=_running(job, worker_id=0), active=active, gamma=job.settings.gamma,
                     base_published=bool(job.base_digest))


def _running(job: Job, *, worker_id: int) -> RunningJob:
    return RunningJob(job_id=job.pk, worker_id=worker_id, group_size=job.settings.group_size,
                      published_version=job.published_version, max_new_tokens=job.settings.max_new_tokens,
                      limits=record_limits(job), max_lease_groups=lease_cap(job))


def lease_cap(job: Job) -> int:
    """The most prompt groups one lease takes: one learner step's groups (``R / n``, at least 1). A fast agent
    batches to save messages (``worker_agent/rollout_loop.py``), but every group of a batch is generated under one
    version and waits in the stream behind the others: a lease of several steps' groups would age past the
    staleness budget ``S`` before the learner reached its last group, and starve the other workers of prompts."""
    return max(1, job.settings.batch_trajectories // max(1, job.settings.group_size))


def _checked(worker: Worker, job_id: int, running: RunningJob | None) -> RunningJob:
    """``running`` when it is this worker's job ``job_id``, else the job read now."""
    if running is not None and running.job_id == job_id and running.worker_id == worker.pk:
        return running
    return running_job(worker=worker, job_id=job_id)


def prompts_lease(*, worker: Worker, job_id: int, groups: int, running: RunningJob | None = None,
                  verdict_key: str | None = None) -> m.Lease | m.NoWork:
    """Lease up to ``groups`` prompt groups to the worker. ``running``: the job as the caller last read it
    (:func:`running_job`); without it the activation is read now. ``verdict_key``: where the outcome is kept for a
    resend of the request (``infra.verdicts``); a request found kept there is answered as it was the first time."""
    job = _checked(worker, job_id, running)
    done = _submit(worker=worker, job=job, groups=[], lease=min(groups, job.max_lease_groups), renew=False,
                   verdict_key=verdict_key, context={})
    return _lease_reply(job_id, done)


NO_WORK_RETRY_AFTER_S = 0.2
EARNINGS_EVERY_S = 10.0  # the agent prints a summary every 10 s by default (--status-every)
_earned: dict[int, tuple[float, float]] = {}  # worker -> (when this process summed it, the sum)


@dataclasses.dataclass(frozen=True)
class _Done:
    """What a request did (or, ``held``, what its first sending did): a verdict per group, the prompts leased, and
    the context the site decided before Redis (kept with the outcome, so a resend is worded the same)."""

    results: list[m.Accepted]
    leased: list[LeasedPrompt]
    context: dict
    held: bool
    reward_errors: list[RewardErrors] = dataclasses.field(default_factory=list)  # of the groups stored now


@dataclasses.dataclass(frozen=True)
class _Request:
    """A rollout request checked by the site and ready for its one Redis round trip (``ReplayBuffer.submit``)."""

    worker_id: int
    job_id: int
    groups: list[TrajectoryGroup]
    sent: list[TrajectoryGroup]  # those that passed the site's checks, in order
    context: dict
    call: dict  # ``ReplayBuffer.submit``'s arguments


def _submit(*, worker: Worker, job: RunningJob, groups: list[TrajectoryGroup], lease: int, renew: bool,
            verdict_key: str | None, context: dict) -> _Done:
    """Check ``groups`` against the job, then return those that pass, renew, lease ``lease`` more and keep the
    outcome under ``verdict_key``, all in one Redis round trip (``ReplayBuffer.submit``). The billing marks ride
    along: each accepted group's event (the worker's measured mu_i), the lease taken (or asked for in vain). What
    fails the checks is refused with its reason, its records counted as ``rejected_records`` in the same trip."""
    request = _request(worker_id=worker.pk, job=job, groups=groups, lease=lease, renew=renew,
                       verdict_key=verdict_key, context=context)
    done = _settled(request, stream.replay(job.job_id).submit(**request.call))
    for errors in done.reward_errors:
        reward_errors.record(job.job_id, errors)
    return done


async def _submit_async(*, worker: Worker, job: RunningJob, groups: list[TrajectoryGroup], lease: int, renew: bool,
                        verdict_key: str | None, context: dict) -> _Done:
    """:func:`_submit` on the event loop's Redis client (``stream.async_client``): no thread, no query."""
    request = _request(worker_id=worker.pk, job=job, groups=groups, lease=lease, renew=renew,
                       verdict_key=verdict_key, context=context)
    done = _settled(request, await stream.replay(job.job_id).submit_async(stream.async_client(), **request.call))
    for errors in done.reward_errors:
        await reward_errors.record_async(job.job_id, errors)
    return done


def _request(*, worker_id: int, job: RunningJob, groups: list[TrajectoryGroup], lease: int, renew: bool,
             verdict_key: str | None, context: dict) -> _Request:
    now = time.time()
    refused: list[str | None] = []
    sent = []
    for group in groups:
        try:
            group.check_for_job(job_id=job.job_id, group_size=job.group_size, max_version=job.published_version,
                                limits=job.limits)
        except RecordError as err:
            refused.append(str(err))
            continue
        refused.append(None)
        sent.append((group, telemetry.accepted_event(worker_id, job_id=job.job_id, at=now, records=len(group.records))))
    context = {**context, "refused": refused, "records": [len(g.records) for g in groups],
               "timeout": settings.ECHO2["LEASE_TIMEOUT_S"]}
    kept = verdicts.kept(worker_id, verdict_key, context) if verdict_key is not None else None
    call = dict(worker_id=worker_id, groups=sent, lease=lease, timeout_s=context["timeout"], renew=renew, now=now,
                observed_key=telemetry.observed_key(worker_id, job.job_id), observed_ttl_s=telemetry.OBSERVED_TTL_S,
                rejected_records=sum(len(g.records) for g, why in zip(groups, refused, strict=True) if why is not None),
                seal_key=group_seal.signing_key(), verdict=kept)
    return _Request(worker_id=worker_id, job_id=job.job_id, groups=groups, sent=[g for g, _ in sent],
                    context=context, call=call)


def _settled(request: _Request, outcome: Submitted) -> _Done:
    """What the request did, from the script's ``outcome``: the groups stored for the first time counted as
    delivered (a resend finds its group stored), their reward errors handed back for the caller to record."""
    context, fresh = request.context, []
    if outcome.held:
        context = json.loads(outcome.context)
    else:
        fresh = [group for group, stored in zip(request.sent, outcome.returns, strict=True)
                 if not isinstance(stored, LeaseError) and not stored.resent]
        delivered.add(job_id=request.job_id, worker_id=request.worker_id, groups=len(fresh))
    return _Done(results=_results(request.groups, context, outcome.returns), leased=outcome.leased, context=context,
                 held=outcome.held, reward_errors=[g.reward_errors for g in fresh if g.reward_errors is not None])


def _results(groups: list[TrajectoryGroup], context: dict, returns: list) -> list[m.Accepted]:
    """A verdict per group: refused by the site's checks (``context``), or as the return script answered.

    The replies here are built with ``model_construct``, unvalidated: every value is the site's own or one parsed
    from a validated message, and the messages' check of each field for NUL characters (``dataplane.strict``, a
    Python call per field) made building a submit's reply a sixth of its cost on the event loop."""
    answered = iter(returns)
    results = []
    for group, reason, n in zip(groups, context["refused"], context["records"], strict=True):
        if reason is None and isinstance(stored := next(answered), LeaseError):
            reason = return_error(str(stored), group.lease_id)
        results.append(m.Accepted.model_construct(job_id=group.job_id, lease_id=group.lease_id,
                                                  accepted=0 if reason else n, rejected=n if reason else 0,
                                                  reasons=[reason] if reason else []))
    return results


def _lease_reply(job_id: int, done: _Done) -> m.Lease | m.NoWork:
    if not done.leased:
        return m.NoWork.model_construct(job_id=job_id, retry_after=NO_WORK_RETRY_AFTER_S)
    return m.Lease.model_construct(job_id=job_id, timeout=done.context["timeout"], leases=[
        m.LeasedPrompt.model_construct(lease_id=g.lease_id, group_id=g.group_id, prompt=g.prompt)
        for g in done.leased
    ])


def trajectories_submit(*, worker: Worker, group: TrajectoryGroup, running: RunningJob | None = None,
                        verdict_key: str | None = None) -> m.Accepted:
    """Check a returned group against its job and lease and append it to the learner's stream, all or nothing.

    The group's schema and group rules were checked when its message was parsed (``TrajectoryGroup``).
    A group that does not fit is refused whole (GRPO needs whole groups); its lease stays open, so the
    prompt is re-leased after the timeout and nothing is lost. ``running`` and ``verdict_key``: as for
    :func:`prompts_lease`. The accepted records are counted for the worker's measured mu_i in the same Redis round
    trip, and the entry carries the site's seal (``dataplane.seal``): what an audit of it later believes
    (``services.audit_verify``).
    """
    job = _checked(worker, group.job_id, running)
    done = _submit(worker=worker, job=job, groups=[group], lease=0, renew=False, verdict_key=verdict_key, context={})
    return done.results[0]


def groups_submit(*, worker: Worker, job_id: int, groups: list[TrajectoryGroup], lease: int = 0,
                  running: RunningJob | None = None, earned_usd: float | None = None,
                  verdict_key: str | None = None) -> m.Submitted:
    """A batch of answered leases, each checked and appended on its own (as :func:`trajectories_submit`: one bad
    group does not sink the others), the worker's other leases renewed when one was accepted (it is visibly working:
    they are not taken from it), then ``lease`` more groups leased: one Redis round trip in all, the verdict kept
    under ``verdict_key`` included. The answer carries what the worker has earned (``earned_usd``, else
    :func:`worker_earned_usd`: a query when due, so a caller off the database thread reads it there first), for its
    agent's status line."""
    job = _checked(worker, job_id, running)
    if earned_usd is None:
        earned_usd = worker_earned_usd(worker.pk, now=time.monotonic())
    done = _submit(worker=worker, job=job, groups=groups, lease=min(lease, job.max_lease_groups), renew=True,
                   verdict_key=verdict_key, context={"earned_usd": earned_usd})
    return m.Submitted.model_construct(job_id=job_id, results=done.results,
                                       lease=_lease_reply(job_id, done) if lease else None,
                                       earned_usd=done.context["earned_usd"])


async def rollout_async(*, worker: Worker, message: m.LeaseRequest | m.Trajectories | m.Submit, running: RunningJob,
                        earned_usd: float | None = None,
                        verdict_key: str | None = None) -> m.Lease | m.NoWork | m.Accepted | m.Submitted:
    """A lease request, a group or a submit answered on the event loop, as :func:`prompts_lease`,
    :func:`trajectories_submit` and :func:`groups_submit` answer them: ``running`` is this worker's job as the caller
    holds it and ``earned_usd`` its earnings as held (no query), and the request's one Redis round trip runs on the
    loop's own client (no thread)."""
    job_id = message.group.job_id if isinstance(message, m.Trajectories) else message.job_id
    if running.job_id != job_id or running.worker_id != worker.pk:
        raise ValueError(f"running is job {running.job_id} of worker {running.worker_id}, not {job_id} of {worker.pk}")
    match message:
        case m.LeaseRequest():
            asked = dict(groups=[], lease=min(message.groups, running.max_lease_groups), renew=False, context={})
        case m.Trajectories():
            asked = dict(groups=[message.group], lease=0, renew=False, context={})
        case _:
            asked = dict(groups=message.groups, lease=min(message.lease, running.max_lease_groups), renew=True,
                         context={"earned_usd": earned_usd})
    return _answer(message, await _submit_async(worker=worker, job=running, verdict_key=verdict_key, **asked))


def submitted_again(*, worker: Worker, message: m.LeaseRequest | m.Trajectories | m.Submit,
                    verdict_key: str) -> m._Msg | None:
    """The reply the first sending of ``message`` got, when its outcome is kept under ``verdict_key``; else None.
    For a resend refused before it reached Redis (the worker released since): its groups may be stored already."""
    outcome = verdicts.stored(worker.pk, verdict_key)
    if outcome is None:
        return None
    context = json.loads(outcome.context)
    groups = message.groups if isinstance(message, m.Submit) else [message.group] \
        if isinstance(message, m.Trajectories) else []
    results = _results(groups, context, outcome.returns)
    return _answer(message, _Done(results=results, leased=outcome.leased, context=context, held=True))


def _answer(message: m.LeaseRequest | m.Trajectories | m.Submit, done: _Done) -> m._Msg:
    """The reply to ``message`` from what it did (or what its first sending did)."""
    match message:
        case m.Submit():
            return m.Submitted.model_construct(job_id=message.job_id, results=done.results,
                                               lease=_lease_reply(message.job_id, done) if message.lease else None,
                                               earned_usd=done.context["earned_usd"])
        case m.Trajectories():
            return done.results[0]
    return _lease_reply(message.job_id, done)


def worker_earned_usd(worker_id: int, *, now: float) -> float:
    """What the ledger has billed for the worker so far, USD, every job: the sum of its activations' ledger sums
    (``Activation.billed_usd``), read again at most every ``EARNINGS_EVERY_S`` per worker and process (an agent
    submits several times a second; its status line prints every few seconds). A query when due: call it where
    database connections are looked after (the agent socket's database thread), not from a plain worker thread,
    where the connection would stay checked out of the pool for good."""
    return workers_earned_usd([worker_id], now=now)[0]


def workers_earned_usd(worker_ids: Sequence[int], *, now: float) -> list[float]:
    """:func:`worker_earned_usd` of each worker, those due read in one query (the agent sockets of a process ask
    together: ``marketplace.realtime.consumers.EARNINGS``)."""
    due = {wid for wid in worker_ids if worker_earned_usd_held(wid, now=now) is None}
    if due:
        sums = dict(Activation.objects.filter(worker_id__in=due).order_by().values("worker_id").annotate(
            total=Sum("billed_usd")).values_list("worker_id", "total"))
        for wid in due:
            _earned[wid] = (now, float(sums.get(wid) or 0))
    return [_earned[wid][1] for wid in worker_ids]


def worker_earned_usd_known(worker_id: int) -> float | None:
    """What :func:`worker_earned_usd` last read in this process, however old; None when it never read it."""
    found = _earned.get(worker_id)
    return found[1] if found is not None else None


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
        limits = _task_limits(spec, job.settings.max_new_tokens)
    except TaskSpecError as err:
        log.warning("job %s: cannot build its task to check records (%s); checking the generic bounds", job.pk, err)
        limits = RecordLimits()
    return dataclasses.replace(limits, vocab_size=job.vocab_size,
                               max_metadata_bytes=settings.ECHO2["MAX_RECORD_METADATA_BYTES"],
                               prompt_extra_tokens=as_prompt_format(job.settings.prompt_format).token_allowance())


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
    """Join one part of a group too big for one frame (``marketplace/core/assembly.py``); after its last part,
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
