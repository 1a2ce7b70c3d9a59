"""The agent's connection: hello, heartbeats, close, silence (``workers``: registration and activations).

Heartbeats are kept in Redis (``marketplace.infra.liveness``) and reach the database only when something must change
now (``worker_heartbeat``); ``worker_heartbeats_fold`` writes ``Worker.last_heartbeat`` in bulk. A socket's close
is queued in Redis and recorded by ``worker_closes_record`` (a coalesced task, and every fold)."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime

from django.conf import settings
from django.db import transaction
from django.db.models import F, Value
from django.db.models.functions import Coalesce, Greatest
from django.utils import timezone

from dataplane import messages as m
from dataplane.hardware import Hardware
from dataplane.replay import RedisError

from ..core import billing
from ..infra import liveness, telemetry
from ..models import Activation, Job, Worker, WorkerSession
from ..reads import selectors
from .base import ServiceError, enqueue_task, push_job_update, pushes_together, retry_conflicts
from .billing import Observation, activation_observe, activation_report, activations_bill, gap_limit_s
from .broadcast import assign_message
from .repair import repair_without
from .workers import _return_leases, worker_activate, worker_release

log = logging.getLogger(__name__)

def _session_open(worker_id: int, *, at: datetime) -> WorkerSession:
    """Start a connection session (uptime). A session still open is stale: the site missed its end (a crash,
    or the agent reconnected before the old socket's close arrived); it ends at the worker's last heartbeat
    (Redis's, when the fold has not written it yet), the last moment the site knew the agent was there."""
    stale = WorkerSession.objects.select_related("worker").filter(worker_id=worker_id, ended_at=None).first()
    if stale is not None:
        last = stale.worker.last_heartbeat or stale.started_at
        seen = liveness.last_seen([worker_id]).get(worker_id)  # newer than the database's when not folded yet
        closed = max(last, _when(seen)) if seen is not None else last
        _session_close(worker_id, at=closed)
        # The billing fold took the socket for open meanwhile (its leases were still pending: a site process killed
        # never said the socket went), so it billed the time in between: given back, and billed again only from
        # this hello, by what the site sees then.
        for activation in Activation.objects.filter(worker_id=worker_id, ended_at=None):
            _bill_until(activation, at=min(closed, at))
            activation_report(activation_id=activation.pk, at=min(closed, at), state="idle")
            activation_report(activation_id=activation.pk, at=at, state="idle")
    return WorkerSession.objects.create(worker_id=worker_id, started_at=at)


def _session_close(worker_id: int, *, at: datetime) -> None:
    """End the worker's open session at ``at`` (never before it started)."""
    for session in WorkerSession.objects.filter(worker_id=worker_id, ended_at=None):
        session.ended_at = max(at, session.started_at)
        session.save(update_fields=["ended_at"])


@transaction.atomic
def worker_connected(*, worker: Worker, installed_version: int | None, at: datetime | None = None,
                     hardware: Hardware | None = None, allow_user_code: bool | None = None) -> list[m._Msg]:
    """An agent said hello (at ``at``, default now): mark it live and open its session; re-send its assignment
    if it is active in a job, or take it back into the job it left by going silent (``_rejoin``). With the
    install report, the one place that sets ``installed_version``; with registration, the one that stores the
    ``hardware`` the agent measured (a hello without it keeps what was stored), and its provider's user-code opt-in
    (``allow_user_code``, likewise; matching reads it). Its heartbeats stay in Redis from here on."""
    activation = selectors.active_activation(worker=worker)
    now = at or timezone.now()
    _session_open(worker.pk, at=now)
    worker.status = Worker.Status.ACTIVE if activation else Worker.Status.IDLE
    worker.last_heartbeat = now
    worker.installed_version = installed_version
    fields = ["status", "last_heartbeat", "installed_version"]
    if hardware is not None:
        worker.hardware, worker.hardware_at = hardware.model_dump(), now
        fields += ["hardware", "hardware_at"]
    if allow_user_code is not None:
        worker.allow_user_code = allow_user_code
        fields.append("allow_user_code")
    worker.save(update_fields=fields)
    replies: list[m._Msg] = [welcome(worker.pk)]
    state, job_id = (activation.state, activation.job_id) if activation else ("idle", None)
    transaction.on_commit(lambda: liveness.mark_online(worker.pk, at=now.timestamp(), state=state, job_id=job_id))
    if activation:
        replies.append(assign_message(activation.job, worker_id=worker.pk))
    elif _rejoin(worker, at=now) is None:
        # A new idle worker may be what a running job waits for; a thousand hellos queue one task a second.
        enqueue_coalesced("provision_waiting_jobs", window_s=PROVISION_WINDOW_S)
    return replies


PROVISION_WINDOW_S = 1.0


def welcome(worker_id: int) -> m.Welcome:
    return m.Welcome(worker_id=worker_id, heartbeat_interval=settings.ECHO2["HEARTBEAT_INTERVAL_S"],
                     max_message_bytes=settings.ECHO2["WS_MAX_MESSAGE_BYTES"])


def rejoin_window() -> timezone.timedelta:
    return timezone.timedelta(seconds=float(settings.ECHO2["WORKER_REJOIN_S"]))


def _rejoin(worker: Worker, *, at: datetime) -> Activation | None:
    """A worker the site released for silence (its socket closed, or a site outage cut every socket) that says
    hello within ``WORKER_REJOIN_S`` goes back to its job at once if the job still runs, rather than waiting for
    the scheduler's hysteresis (``REPLAN_INTERVAL_S``) to notice the missing capacity. The assignment is pushed."""
    last = (Activation.objects.select_related("job").filter(worker=worker, ended_at__gte=at - rejoin_window())
            .order_by("-ended_at").first())
    return rejoin_after(worker, last, at=at)


def rejoin_after(worker: Worker, last: Activation | None, *, at: datetime) -> Activation | None:
    """:func:`_rejoin` of ``worker``, whose latest activation (its job read with it) is ``last``."""
    if (last is None or last.ended_at < at - rejoin_window() or last.end_code != Activation.End.LOST
            or last.job.status != Job.Status.RUNNING):
        return None
    try:
        activation = worker_activate(worker=worker, job=last.job)
    except ServiceError:  # suspended meanwhile
        return None
    log.info("job %s: worker %s is back %.0f s after it went silent; rejoined", last.job_id, worker.pk,
             (at - last.ended_at).total_seconds())
    return activation


def enqueue_coalesced(name: str, *, window_s: float) -> None:
    """Enqueue task ``name`` (no arguments) once per ``window_s`` however many ask (after commit): the first
    caller of a window enqueues it to run when the window ends, so it covers every caller of the window. Under
    ``CELERY_TASK_ALWAYS_EAGER`` every caller runs it, as ``enqueue_task`` does. With Redis away, every caller
    enqueues."""
    def claim_and_send() -> None:
        from celery import current_app

        if current_app.conf.task_always_eager:
            enqueue_task(name)
            return
        try:
            first = liveness.claim(name, window_s=window_s)
        except RedisError:
            first = True
        if first:
            enqueue_task(name, countdown=window_s)

    transaction.on_commit(claim_and_send)


def worker_heartbeat_record(*, worker_id: int, throughput: float | None, state: str = "idle",
                            job_id: int | None = None, at: float | None = None) -> liveness.Beat:
    """A heartbeat, recorded in Redis alone (no query: the agent socket calls it off the database thread). The
    returned ``Beat`` says whether the database must hear of it now: then call ``worker_heartbeat_apply``."""
    return liveness.heartbeat(worker_id, at=time.time() if at is None else at, throughput=throughput, state=state,
                              job_id=job_id)


async def worker_heartbeats_record_async(beats: Sequence[dict]) -> list[liveness.Beat | BaseException]:
    """:func:`worker_heartbeat_record` of several heartbeats (each its keyword arguments and ``at``, when the site
    received it) on the event loop (the agent socket's: Redis without a thread hop), in one round trip
    (``liveness.heartbeats_async``): the agent sockets of a process hand theirs over together
    (``marketplace.realtime.aside.BEATS``)."""
    return await liveness.heartbeats_async(beats)


def worker_heartbeat_apply(*, worker: Worker, beat: liveness.Beat, throughput: float | None, state: str = "idle",
                           reason: str = "", refused: bool = False, job_id: int | None = None) -> None:
    """``worker_heartbeat`` for a heartbeat ``worker_heartbeat_record`` already put in Redis. When it fails, the
    next heartbeat goes to the database again."""
    try:
        worker_heartbeat(worker=worker, throughput=throughput, state=state, reason=reason, refused=refused,
                         job_id=job_id,
                         previous_at=beat.previous_at, recorded=True, held_online=beat.reason != liveness.NOT_ONLINE)
    except Exception:
        liveness.forget_state(worker.pk)
        raise


@retry_conflicts
@transaction.atomic
def worker_heartbeat(*, worker: Worker, throughput: float | None, state: str = "idle", reason: str = "",
                     refused: bool = False, job_id: int | None = None, previous_at: float | None = None,
                     recorded: bool = False, held_online: bool = False) -> None:
    """Refresh the worker's liveness in the database; a heartbeat from a worker marked offline brings it back. Its
    activation is billed by what the site observed it do (``_observe``), never by the ``state`` or ``throughput``
    it claims: those are kept as "reported" (``telemetry.record_heartbeat``), and only a ``failed`` state for its
    job counts (it lowers its own bill). ``recorded``: Redis already has it (``worker_heartbeat_record``, which also
    gives ``previous_at``, the worker's heartbeat before this one: when the last report is older than the billing
    gap limit, the bill is first brought up to it, as a report at every heartbeat would have done). ``held_online``:
    Redis holds the worker online (``liveness``), which it stops doing once the database marks it offline, so the
    database is not asked (a worker marked offline between the two is brought back by its next heartbeat).

    Otherwise whether it was offline is asked of the database, not of ``worker``: the consumer's copy is as old as the
    socket, and expiry may have marked the worker offline since (the agent stalled, then resumed). The
    version the agent says it has installed is not taken from heartbeats: only the hello and the install
    report set it, so a heartbeat sent just after a release cannot erase the record of what was installed.
    """
    now = timezone.now()
    if not recorded:
        telemetry.record_heartbeat(worker.pk, at=now.timestamp(), throughput=throughput)
    fields: dict = {"last_heartbeat": now}
    activation = selectors.active_activation(worker=worker)
    if activation is not None:  # mu_i is what the site accepted from it, never the figure it claims
        measured = telemetry.measure_worker(worker.pk, job_id=activation.job_id,
                                            since=activation.started_at.timestamp(), now=now.timestamp())
        if measured is not None:
            fields["throughput"] = measured
    if not held_online and Worker.objects.filter(pk=worker.pk, status=Worker.Status.OFFLINE).exists():
        fields["status"] = Worker.Status.ACTIVE if activation is not None else Worker.Status.IDLE
        _session_open(worker.pk, at=now)
    Worker.objects.filter(pk=worker.pk).update(**fields)
    transaction.on_commit(lambda: liveness.mark_online(worker.pk, at=now.timestamp(), state=state, job_id=job_id))
    if activation is not None:
        if previous_at is not None and (now - activation.reported_at).total_seconds() > gap_limit_s():
            # the report at ``now`` would bill nothing past the gap limit: heartbeats that stayed in Redis would
            # each have brought the bill up to date
            _bill_until(activation, at=datetime.fromtimestamp(previous_at, tz=UTC))
        reported = billing.effective_state(reported=state, reported_job_id=job_id, job_id=activation.job_id)
        _observe(activation, at=now, reported=reported, reason=reason, refused=refused,
                 throughput=fields.get("throughput", worker.throughput))


def _bill_until(activation: Activation, *, at: datetime) -> None:
    """Bring the activation's bill up to ``at`` (the worker's last heartbeat) by what was observed, lease by lease,
    when it was last billed before then: a report at ``at`` alone would bill the whole span in the state of the
    last fold (a lease that ended after it billed to ``at``, one that began after it not at all), and nothing past
    billing's gap limit."""
    if at > activation.reported_at:
        activation_observe(activation=activation, at=at, reported=activation.state)


def _observe(activation: Activation, *, at: datetime, reported: str, reason: str, throughput: float | None,
             seen: telemetry.Observed | None = None, connected: bool = True, refused: bool = False) -> None:
    """Bill the activation up to ``at`` by what the site observed and record that state (pushed to the job page
    when it changed); then release the worker, and re-plan its job, when it returned nothing past the silence
    bound (``billing.silent_reason``) or its own rollout loop has been failing for ``ROLLOUT_FAILED_RELEASE_S``."""
    if seen is None:
        seen = telemetry.observed([activation.worker_id], job_id=activation.job_id)[activation.worker_id]
    updated = activation_observe(activation=activation, at=at, reported=reported, reason=reason, seen=seen,
                                 connected=connected)
    if updated is None:
        return
    if updated.state != activation.state:
        push_job_update(activation.job_id)  # the job page shows each worker's state
    updated.job = activation.job  # read with it (``selectors.active_activation``): no query per heartbeat
    why, code = _release_reason(updated, seen=seen, now=at.timestamp(), throughput=throughput, refused=refused)
    if why:
        log.warning("job %s: worker %s released: %s", activation.job_id, activation.worker_id, why)
        worker_release(activation=updated, reason=why[:200], code=code)
        enqueue_task("replan_job", activation.job_id)


def _release_reason(activation: Activation, *, seen: telemetry.Observed, now: float,
                    throughput: float | None, refused: bool = False) -> tuple[str, str]:
    """Why the activation must end now, in words ("" if it need not) and as an ``Activation.End`` code: the worker
    refused the job, its rollout loop failing too long (its own word), or nothing returned past the silence bound
    (what the site saw)."""
    if activation.state == "failed" and refused:
        # it will not serve this job (user code it does not run): waiting helps nobody. The agent says so in its
        # heartbeat (``refused``); the site keeps it as a code from here on.
        return activation.state_reason, Activation.End.REFUSED
    echo = settings.ECHO2
    limit = float(echo["ROLLOUT_FAILED_RELEASE_S"])
    if billing.failing_too_long(state=activation.state, since=activation.state_since.timestamp(), now=now,
                                limit_s=limit):
        return f"rollout loop failing for {limit:.0f} s: {activation.state_reason}", Activation.End.OTHER
    bound = billing.silence_bound_s(min_s=float(echo["SILENT_RELEASE_S"]), groups=float(echo["SILENT_RELEASE_GROUPS"]),
                                    group_size=activation.job.settings.group_size, throughput=throughput)
    silent = billing.silent_reason(started=activation.started_at.timestamp(), installed=seen.installed,
                                   accepted=seen.accepted, starved=seen.starved, now=now, bound_s=bound,
                                   loading_bound_s=float(echo["LOADING_RELEASE_S"]))
    return silent, Activation.End.SILENT if silent else Activation.End.OTHER


@pushes_together()
def activations_release_silent(*, now: datetime | None = None) -> int:
    """The billing fold: look at every open activation of a running job by what the site saw (one Redis round trip
    per job) and bill, up to ``now``, the ones in a billed state, whose observed state changed, whose measured
    ``mu_i`` moved or that returned nothing past the bound, all of a job's together in a few statements whatever
    their number (``billing.activations_bill``); then release the silent ones (``worker_release``, one transaction
    each). The workers it looked at are marked billed in Redis (``liveness.mark_billed``), so their heartbeats leave
    the periodic report to it. Expiry runs it, so the bills and states of a job's workers are at most one expiry
    period old, whatever their heartbeats say or whether they reach the database. Returns how many it released."""
    now = now or timezone.now()
    by_job: dict[int, list[Activation]] = defaultdict(list)
    jobs: dict[int, Job] = {}
    for activation in (Activation.objects.filter(ended_at=None, job__status=Job.Status.RUNNING)
                       .select_related("worker", "job")):
        activation.job = jobs.setdefault(activation.job_id, activation.job)  # its settings validated once a job
        by_job[activation.job_id].append(activation)
    released = 0
    for job_id, activations in by_job.items():
        seen = telemetry.observed([a.worker_id for a in activations], job_id=job_id)
        looked: list[int] = []
        due: list[Observation] = []
        for activation in activations:
            observed = seen[activation.worker_id]
            reported = activation.state if activation.state == "failed" else "idle"
            connected = activation.worker.status != Worker.Status.OFFLINE  # a closed socket is never billed again
            state, _ = billing.observed_state(reported=reported, started=activation.started_at.timestamp(),
                                              installed=observed.installed, held_since=observed.held_since,
                                              held_until=observed.held_until, now=now.timestamp(),
                                              connected=connected)
            measured = telemetry.measured_throughput(list(observed.accepted_events),
                                                     since=activation.started_at.timestamp(), now=now.timestamp())
            why, _ = _release_reason(activation, seen=observed, now=now.timestamp(),
                                     throughput=measured or activation.worker.throughput)
            moved = measured is not None and measured != activation.worker.throughput
            if state == activation.state and state not in billing.BILLABLE_STATES and not why and not moved:
                looked.append(activation.worker_id)  # nothing to bill or record
                continue
            due.append(Observation(activation_id=activation.pk, worker_id=activation.worker_id, seen=observed,
                                   reported=reported, reason=activation.state_reason, connected=connected,
                                   throughput=measured))
        bills = _bill_in_slices(job_id, due, at=now)
        liveness.mark_billed(looked + [a.worker_id for a in activations if a.pk in bills])
        measured_now = {o.activation_id: o.throughput for o in due}
        changed = False
        for activation in activations:
            if activation.pk not in bills:
                continue
            bill = bills[activation.pk]
            changed = changed or bill.state != activation.state
            for name, value in dataclasses.asdict(bill).items():
                setattr(activation, name, value)
            why, code = _release_reason(activation, seen=seen[activation.worker_id], now=now.timestamp(),
                                        throughput=measured_now[activation.pk] or activation.worker.throughput)
            if why:
                log.warning("job %s: worker %s released: %s", job_id, activation.worker_id, why)
                worker_release(activation=activation, reason=why[:200], code=code)
                enqueue_task("replan_job", job_id)
                released += 1
        if changed:
            push_job_update(job_id)  # the job page shows each worker's state
    return released


def _bill_in_slices(job_id: int, due: list[Observation], *, at: datetime) -> dict:
    """``activations_bill`` of ``due``, a transaction per ``FOLD_ROWS`` of them."""
    bills: dict = {}
    for first in range(0, len(due), FOLD_ROWS):
        bills |= activations_bill(job_id=job_id, observations=due[first:first + FOLD_ROWS], at=at)
    return bills


def worker_socket_closed(*, worker_id: int, since: datetime | None, at: datetime | None = None) -> None:
    """The agent socket whose session began at ``since`` (its hello; None: it said none) closed at ``at``
    (default now): queued in Redis, no query, so a thousand closes at once fit in daphne's close timeout;
    ``worker_closes_record`` (a task, coalesced) records them."""
    at = at or timezone.now()
    liveness.record_close(worker_id, since=None if since is None else since.isoformat(), at=at.timestamp())
    enqueue_coalesced("record_worker_closes", window_s=CLOSES_WINDOW_S)


CLOSES_WINDOW_S = 0.2


def worker_closes_record() -> int:
    """Record every queued socket close (``worker_socket_closed``) in one transaction (``_closes_apply``): a
    thousand closes cost a few queries, plus a few per worker that was active in a job. When it fails (the
    database away), the closes are queued again. Returns how many were taken from the queue."""
    closes = liveness.take_closes()
    try:
        _closes_apply([(c["worker_id"], None if c["since"] is None else datetime.fromisoformat(c["since"]),
                        _when(c["at"])) for c in closes])
    except Exception:
        liveness.requeue_closes(closes)
        raise
    return len(closes)


@transaction.atomic
def worker_disconnected(*, worker: Worker, since: datetime | None = None, at: datetime | None = None) -> None:
    """The socket whose session began at ``since`` (its hello) closed at ``at`` (default now): the session ends
    then, the worker leaves the chains and the prompts it leased go back to the pool at once (its agent cannot
    answer them on a closed socket). The activation stays open for a reconnect until the worker times out.
    When the agent has already said hello on a newer socket (an open session began after ``since``), this
    close is old news and changes nothing."""
    _closes_apply([(worker.pk, since, at or timezone.now())])


@transaction.atomic
def _closes_apply(closes: list[tuple[int, datetime | None, datetime]]) -> None:
    """``worker_disconnected`` for many ``(worker id, since, at)`` at once; per worker only its latest close
    counts (an older one's session is older still)."""
    latest: dict[int, tuple[datetime | None, datetime]] = {}
    for wid, since, at in closes:
        if wid not in latest or at >= latest[wid][1]:
            latest[wid] = (since, at)
    sessions = defaultdict(list)
    for session in WorkerSession.objects.filter(worker_id__in=list(latest), ended_at=None):
        sessions[session.worker_id].append(session)
    gone = {wid: at for wid, (since, at) in latest.items()
            if since is None or not any(s.started_at > since for s in sessions[wid])}  # else: a newer socket
    if not gone:
        return
    Worker.objects.filter(pk__in=list(gone)).update(status=Worker.Status.OFFLINE)
    ended = [s for wid in gone for s in sessions[wid]]
    for session in ended:
        session.ended_at = max(gone[session.worker_id], session.started_at)
    WorkerSession.objects.bulk_update(ended, ["ended_at"], batch_size=500)
    active = list(Activation.objects.filter(worker_id__in=list(gone), ended_at=None))
    seen = liveness.last_seen(sorted({a.worker_id for a in active}))
    for activation in active:
        at, wid = gone[activation.worker_id], activation.worker_id
        if wid in seen:
            _bill_until(activation, at=_when(seen[wid]))
        activation_observe(activation=activation, at=at)
        activation_report(activation_id=activation.pk, at=at, state="idle")  # a closed socket delivers nothing
        transaction.on_commit(lambda job_id=activation.job_id, wid=wid: _return_leases(job_id, wid, why="disconnected"))
    for wid in sorted({a.worker_id for a in active}):
        repair_without(Worker(pk=wid))
    transaction.on_commit(lambda: liveness.mark_offline(list(gone)))


def worker_heartbeats_fold() -> int:
    """Write the heartbeats kept in Redis since the last fold into ``Worker.last_heartbeat`` (one bulk update;
    a time never moves back), and record the socket closes still queued. Celery beat runs it every
    ``HEARTBEAT_FOLD_S``; expiry runs it first. Returns how many workers it updated."""
    started = time.time()
    since = liveness.folded_at()
    seen = liveness.seen_since(0.0 if since is None else since - FOLD_SLACK_S)
    ids = sorted(seen)
    for first in range(0, len(ids), FOLD_ROWS):  # a transaction per slice: see FOLD_ROWS
        with transaction.atomic():
            # Only rows no request holds now, locked in id order: a job's finish or a heartbeat's billing that holds
            # a worker's row while it waits for another's would deadlock against one UPDATE locking them in the
            # table's order (seen with two site processes: a cancel answered 500). A skipped row is written by the
            # next fold from its next heartbeat; a worker that fell silent meanwhile keeps an older last_heartbeat
            # here, and expiry asks Redis before it acts on that (liveness.last_seen).
            free = list(Worker.objects.select_for_update(no_key=True, skip_locked=True)
                        .filter(pk__in=ids[first:first + FOLD_ROWS]).order_by("pk").values_list("pk", flat=True))
            rows = [Worker(pk=wid, last_heartbeat=Greatest(
                Coalesce(F("last_heartbeat"), Value(_when(seen[wid]))), Value(_when(seen[wid])))) for wid in free]
            Worker.objects.bulk_update(rows, ["last_heartbeat"])
    liveness.set_folded_at(started)
    worker_closes_record()
    return len(seen)


# Rows the folds lock in one transaction. They lock only rows no one holds (SKIP LOCKED), but every heartbeat's
# report and install report of a worker they hold waits for their commit, and Celery's process builds the statements
# between the locks and the commit: 1,000 workers in one transaction held every agent socket's database threads for
# seconds while a busy machine's Celery composed its UPDATE.
FOLD_ROWS = 100
FOLD_SLACK_S = 5.0  # a heartbeat stamped just before a fold read Redis may land just after: read a little back


def _when(at: float) -> datetime:
    return datetime.fromtimestamp(at, tz=UTC)


def expire_silent_workers() -> int:
    """Mark workers silent for longer than WORKER_TIMEOUT_S offline and end their sessions and activations
    (one transaction per worker). Heartbeats kept in Redis are folded first, and each candidate is checked
    against Redis too, so a lagging fold never expires a live worker."""
    worker_heartbeats_fold()
    now = timezone.now()
    cutoff = now - timezone.timedelta(seconds=settings.ECHO2["WORKER_TIMEOUT_S"])
    silent = list(Worker.objects.exclude(status=Worker.Status.OFFLINE).filter(last_heartbeat__lt=cutoff))
    seen = liveness.last_seen([w.pk for w in silent])
    count = 0
    for worker in silent:
        if seen.get(worker.pk, 0.0) >= cutoff.timestamp():
            continue  # heard from since the fold
        with transaction.atomic():
            worker.status = Worker.Status.OFFLINE
            worker.save(update_fields=["status"])
            _session_close(worker.pk, at=worker.last_heartbeat)  # it went silent then, not now
            repair_without(worker)  # before the release ends the activation that names its job
            for activation in Activation.objects.filter(worker=worker, ended_at=None):
                _bill_until(activation, at=worker.last_heartbeat)
                # nothing is billed after its last heartbeat, whatever it leased before
                activation_report(activation_id=activation.pk, at=worker.last_heartbeat, state="idle")
                worker_release(activation=activation, reason="worker stopped sending heartbeats",
                               code=Activation.End.LOST)
            transaction.on_commit(lambda wid=worker.pk: liveness.mark_offline([wid]))
        count += 1
    # Offline workers whose activation is still open (socket closed long ago) are released too.
    for activation in Activation.objects.filter(ended_at=None, worker__status=Worker.Status.OFFLINE,
                                                worker__last_heartbeat__lt=cutoff):
        worker_release(activation=activation, reason="worker disconnected", code=Activation.End.LOST)
    activations_release_silent(now=now)
    return count
