"""Writes, and every push to agents and dashboards (sent after the transaction commits)."""

from __future__ import annotations

import logging
import math
import secrets
import statistics
import time
from datetime import datetime
from decimal import Decimal
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from dataplane import messages as m
from dataplane.jobs import JobSpec
from dataplane.records import RecordError, TrajectoryGroup
from dataplane.replay import LeaseError
from dataplane.tasks import TaskSpecError, build_task

from . import chains, selectors, stream, telemetry
from .models import Activation, Job, JobMetric, Provider, Snapshot, Worker, WorkerCalibration, WorkerSession

log = logging.getLogger(__name__)


class ServiceError(ValueError):
    """A request that cannot be carried out; ``str(err)`` is the reason shown to the caller."""


# ---- pushes ------------------------------------------------------------------------------------


def worker_group(worker_id: int) -> str:
    return f"worker.{worker_id}"


def job_group(job_id: int) -> str:
    return f"job.{job_id}"


def _push(group: str, event: dict[str, Any]) -> None:
    def send() -> None:
        layer = get_channel_layer()
        if layer is not None:
            async_to_sync(layer.group_send)(group, event)

    transaction.on_commit(send)


def _push_to_worker(worker_id: int, message: m._Msg) -> None:
    _push(worker_group(worker_id), {"type": "agent.message", "message": message.model_dump(mode="json")})


def _push_job_update(job: Job | int) -> None:
    """Tell the job's dashboards that it changed (after the transaction commits). The event carries no
    state: each open job page computes the live view itself, at most twice a second
    (``frontend.consumers.JobLiveConsumer``), so a burst of installs costs one query round per viewer and
    a job nobody watches costs nothing."""
    job_id = job if isinstance(job, int) else job.pk
    _push(job_group(job_id), {"type": "job.changed", "job_id": job_id})


# ---- providers and workers --------------------------------------------------------------------


def worker_register(*, user, name: str, gpu: str, price_per_hour: Decimal, bandwidth_bps: int,
                    relay_address: str = "") -> tuple[Worker, str]:
    """Register a machine for ``user`` (made a provider if needed); returns the worker and its agent key.

    The key is shown once: only its hash is stored.
    """
    provider, _ = Provider.objects.get_or_create(user=user, defaults={"display_name": user.get_username()})
    key = "e2w_" + secrets.token_urlsafe(32)
    try:
        with transaction.atomic():
            worker = Worker.objects.create(
                provider=provider, name=name, gpu=gpu, price_per_hour=price_per_hour, bandwidth_bps=bandwidth_bps,
                relay_address=relay_address, key_hash=selectors.hash_key(key),
            )
    except IntegrityError:
        raise ServiceError(f"name: you already have a worker named {name!r}") from None
    return worker, key


def worker_calibrate(*, worker: Worker, model_dir: str, task: dict, throughput: float,
                     tokens_per_s: float | None = None) -> WorkerCalibration:
    """Record a benchmarked throughput for (model, task); the newest measurement wins."""
    try:
        task_name = build_task(task).name
    except TaskSpecError as err:
        raise ServiceError(str(err)) from None
    calibration, _ = WorkerCalibration.objects.update_or_create(
        worker=worker, model_dir=model_dir, task_name=task_name,
        defaults={"throughput": throughput, "tokens_per_s": tokens_per_s, "measured_at": timezone.now()},
    )
    if worker.throughput is None:
        Worker.objects.filter(pk=worker.pk).update(throughput=throughput)
    return calibration


def _assign_message(job: Job) -> m.Assign:
    snap = selectors.latest_snapshot(job)
    return m.Assign(
        job_id=job.pk, model=job.model_dir, task=job.task, group_size=job.group_size,
        max_new_tokens=job.max_new_tokens, temperature=job.temperature, top_p=job.top_p,
        snapshot=_snapshot_message(snap).model_dump(mode="json") if snap else None,
    )


def _snapshot_message(snap: Snapshot, *, job: Job | None = None, route: tuple[int | None, int | None] | None = None,
                      addresses: dict[int, str] | None = None) -> m.SnapshotAvailable:
    """The snapshot for one worker. ``route`` is its (parent, child) in the chain plan (parent None: the
    learner's relay); without a route it fetches over HTTP from ``snap.url``."""
    relay: dict[str, Any] = {"strategy": job.broadcast_strategy} if job is not None else {}
    if job is not None and route is not None and _relaying(job):
        parent, child = route
        address = job.learner_relay if parent is None else (addresses or {}).get(parent, "")
        if address:
            relay.update(parent=address, parent_worker_id=parent, children=[child] if child is not None else [])
    return m.SnapshotAvailable(job_id=snap.job_id, version=snap.version, url=snap.url, manifest=snap.manifest,
                               published_at=snap.published_at.timestamp(), **relay)


def _route(plan: chains.ChainPlan, worker_id: int) -> tuple[int | None, int | None] | None:
    """(parent, child) of a worker in one of the plan's chains; None when it is rollout-only or absent."""
    for chain in plan.chains:
        if worker_id in chain:
            i = chain.index(worker_id)
            return (chain[i - 1] if i else chains.LEARNER), (chain[i + 1] if i + 1 < len(chain) else None)
    return None


def _session_open(worker_id: int, *, at: datetime) -> WorkerSession:
    """Start a connection session (uptime). A session still open is stale: the site missed its end (a crash,
    or the agent reconnected before the old socket's close arrived); it ends at the worker's last heartbeat,
    the last moment the site knew the agent was there."""
    with transaction.atomic():
        stale = WorkerSession.objects.select_related("worker").filter(worker_id=worker_id, ended_at=None).first()
        if stale is not None:
            _session_close(worker_id, at=stale.worker.last_heartbeat or stale.started_at)
        return WorkerSession.objects.create(worker_id=worker_id, started_at=at)


def _session_close(worker_id: int, *, at: datetime) -> None:
    """End the worker's open session at ``at`` (never before it started)."""
    for session in WorkerSession.objects.filter(worker_id=worker_id, ended_at=None):
        session.ended_at = max(at, session.started_at)
        session.save(update_fields=["ended_at"])


def worker_connected(*, worker: Worker, installed_version: int | None, at: datetime | None = None) -> list[m._Msg]:
    """An agent said hello (at ``at``, default now): mark it live and open its session; re-send its assignment
    if it is active in a job."""
    activation = selectors.active_activation(worker=worker)
    now = at or timezone.now()
    _session_open(worker.pk, at=now)
    worker.status = Worker.Status.ACTIVE if activation else Worker.Status.IDLE
    worker.last_heartbeat = now
    worker.installed_version = installed_version
    worker.save(update_fields=["status", "last_heartbeat", "installed_version"])
    replies: list[m._Msg] = [m.Welcome(worker_id=worker.pk, heartbeat_interval=settings.ECHO2["HEARTBEAT_INTERVAL_S"])]
    if activation:
        replies.append(_assign_message(activation.job))
    else:
        from .tasks import provision_waiting_jobs  # a new idle worker may be what a running job waits for

        transaction.on_commit(provision_waiting_jobs.delay)
    return replies


def worker_heartbeat(*, worker: Worker, throughput: float | None, installed_version: int | None) -> None:
    """Refresh the worker's liveness and throughput; a heartbeat from a worker marked offline brings it back.

    Whether it was offline is asked of the database, not of ``worker``: the consumer's copy is as old as the
    socket, and expiry may have marked the worker offline since (the agent stalled, then resumed).
    """
    now = timezone.now()
    telemetry.record_heartbeat(worker.pk, at=now.timestamp(), throughput=throughput)
    fields = {"last_heartbeat": now, "installed_version": installed_version}
    if throughput is not None:
        fields["throughput"] = throughput
    with transaction.atomic():
        if Worker.objects.filter(pk=worker.pk, status=Worker.Status.OFFLINE).exists():
            active = selectors.active_activation(worker=worker) is not None
            fields["status"] = Worker.Status.ACTIVE if active else Worker.Status.IDLE
            _session_open(worker.pk, at=now)
        Worker.objects.filter(pk=worker.pk).update(**fields)


def worker_disconnected(*, worker: Worker, since: datetime | None = None) -> None:
    """The socket whose session began at ``since`` (its hello) closed: the session ends now and the worker
    leaves the chains. The activation stays open for a reconnect until the worker times out. When the agent
    has already said hello on a newer socket (an open session began after ``since``), this close is old
    news and changes nothing."""
    with transaction.atomic():
        if since is not None and WorkerSession.objects.filter(
                worker_id=worker.pk, ended_at=None, started_at__gt=since).exists():
            return
        Worker.objects.filter(pk=worker.pk).update(status=Worker.Status.OFFLINE)
        _session_close(worker.pk, at=timezone.now())
        _repair_without(worker)


def worker_activate(*, worker: Worker, job: Job) -> Activation:
    """Start billing ``worker`` for ``job`` and send it the assignment."""
    activation = Activation.objects.create(job=job, worker=worker, price_per_hour=worker.price_per_hour)
    Worker.objects.filter(pk=worker.pk).update(status=Worker.Status.ACTIVE)
    _push_to_worker(worker.pk, _assign_message(job))
    _push_job_update(job.pk)
    log.info("job %s: activated worker %s at $%s/h", job.pk, worker.name, worker.price_per_hour)
    return activation


def worker_release(*, activation: Activation, reason: str) -> None:
    activation.ended_at = timezone.now()
    activation.end_reason = reason
    activation.save(update_fields=["ended_at", "end_reason"])
    Worker.objects.filter(pk=activation.worker_id, status=Worker.Status.ACTIVE).update(status=Worker.Status.IDLE)
    _push_to_worker(activation.worker_id, m.Release(job_id=activation.job_id, reason=reason))
    _push_job_update(activation.job_id)


def expire_silent_workers() -> int:
    """Mark workers silent for longer than WORKER_TIMEOUT_S offline and end their sessions and activations."""
    cutoff = timezone.now() - timezone.timedelta(seconds=settings.ECHO2["WORKER_TIMEOUT_S"])
    silent = Worker.objects.exclude(status=Worker.Status.OFFLINE).filter(last_heartbeat__lt=cutoff)
    count = 0
    for worker in silent:
        with transaction.atomic():
            worker.status = Worker.Status.OFFLINE
            worker.save(update_fields=["status"])
            _session_close(worker.pk, at=worker.last_heartbeat)  # it went silent then, not now
            _repair_without(worker)  # before the release ends the activation that names its job
            for activation in Activation.objects.filter(worker=worker, ended_at=None):
                worker_release(activation=activation, reason="worker stopped sending heartbeats")
        count += 1
    # Offline workers whose activation is still open (socket closed long ago) are released too.
    for activation in Activation.objects.filter(ended_at=None, worker__status=Worker.Status.OFFLINE,
                                                worker__last_heartbeat__lt=cutoff):
        worker_release(activation=activation, reason="worker disconnected")
    return count


# ---- jobs ----------------------------------------------------------------------------------------


def job_create(*, owner, spec: JobSpec) -> Job:
    return Job.objects.create(owner=owner, **spec.model_dump())


def job_start(*, job: Job) -> Job:
    if job.status != Job.Status.DRAFT:
        raise ServiceError(f"status: job is {job.status}; only a draft job can be started")
    job.status = Job.Status.RUNNING
    job.started_at = timezone.now()
    job.save(update_fields=["status", "started_at"])
    stream.replay(job.pk).ensure_groups()
    from .tasks import provision_job

    transaction.on_commit(lambda: provision_job.delay(job.pk))
    _push_job_update(job)
    return job


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
    transaction.on_commit(lambda: stream.replay(job.pk).drop())
    _push_job_update(job)
    return job


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
    _push_job_update(job)
    return job


def job_resume(*, job: Job) -> Job:
    """Back to running: the scheduler activates a pool at once (``scheduling.job_replan``)."""
    if job.status != Job.Status.PAUSED:
        raise ServiceError(f"status: job is {job.status}; only a paused job can be resumed")
    job.status = Job.Status.RUNNING
    job.status_reason = ""
    job.save(update_fields=["status", "status_reason"])
    stream.replay(job.pk).ensure_groups()
    from .tasks import provision_job

    transaction.on_commit(lambda: provision_job.delay(job.pk))
    _push_job_update(job)
    return job


def job_provision(*, job: Job) -> list[Activation]:
    """Activate every idle worker for a running job.

    This is the calibration phase (the learner has not measured ``T_train`` yet, so no target exists and
    every worker's ``mu_i`` for this model gets measured) and the answer when no pool can keep up. Once
    a target exists, ``scheduling.job_replan`` decides with hysteresis instead.
    """
    if job.status != Job.Status.RUNNING:
        return []
    busy = Activation.objects.filter(ended_at=None).values("worker_id")
    activations = []
    for worker in Worker.objects.filter(status=Worker.Status.IDLE).exclude(pk__in=busy):
        with transaction.atomic():
            activations.append(worker_activate(worker=worker, job=job))
    return activations


# ---- the rollout loop: leases and trajectories ---------------------------------------------------


def _running_activation(worker: Worker, job_id: int) -> Activation:
    activation = selectors.active_activation(worker=worker, job_id=job_id)
    if activation is None:
        raise ServiceError(f"job_id: this worker is not active in job {job_id}")
    if activation.job.status != Job.Status.RUNNING:
        raise ServiceError(f"job_id: job {job_id} is {activation.job.status}")
    return activation


def prompts_lease(*, worker: Worker, job_id: int, groups: int) -> m.Lease | m.NoWork:
    _running_activation(worker, job_id)
    timeout = settings.ECHO2["LEASE_TIMEOUT_S"]
    leased = stream.replay(job_id).lease(worker_id=worker.pk, count=groups, timeout_s=timeout)
    if not leased:
        return m.NoWork(job_id=job_id, retry_after=0.2)
    return m.Lease(job_id=job_id, timeout=timeout, leases=[
        m.LeasedPrompt(lease_id=g.lease_id, group_id=g.group_id, prompt=g.prompt) for g in leased
    ])


def trajectories_submit(*, worker: Worker, group: TrajectoryGroup) -> m.Accepted:
    """Check a returned group against its job and lease and append it to the learner's stream, all or nothing.

    The group's schema and group rules were checked when its message was parsed (``TrajectoryGroup``).
    A group that does not fit is refused whole (GRPO needs whole groups); its lease stays open, so the
    prompt is re-leased after the timeout and nothing is lost.
    """
    activation = _running_activation(worker, group.job_id)
    job = activation.job
    buffer = stream.replay(group.job_id)
    n = len(group.records)
    try:
        group.check_for_job(job_id=job.pk, group_size=job.group_size, max_version=job.published_version)
        buffer.return_group(worker_id=worker.pk, group=group)
    except (RecordError, LeaseError) as err:
        buffer.count("rejected_records", n)
        return m.Accepted(job_id=group.job_id, lease_id=group.lease_id, accepted=0, rejected=n, reasons=[str(err)])
    return m.Accepted(job_id=group.job_id, lease_id=group.lease_id, accepted=n, rejected=0)


def trajectories_malformed(*, worker: Worker, job_id: object, records: object) -> None:
    """Count the records of a ``trajectories`` message whose group failed its schema, when it names a job
    this worker is running (the reply is the parse error)."""
    if not isinstance(job_id, int) or selectors.active_activation(worker=worker, job_id=job_id) is None:
        return
    stream.replay(job_id).count("rejected_records", len(records) if isinstance(records, list) else 1)


# ---- learner reports -----------------------------------------------------------------------------


def learner_announce(*, job: Job, t_train: float | None, relay_address: str | None = None) -> Job:
    job.learner_seen_at = timezone.now()
    fields = ["learner_seen_at"]
    if t_train is not None:
        job.learner_t_train = t_train
        fields.append("learner_t_train")
    if relay_address is not None:
        job.learner_relay = relay_address
        fields.append("learner_relay")
    job.save(update_fields=fields)
    return job


def snapshot_publish(*, job: Job, version: int, url: str, manifest: dict) -> Snapshot:
    """Record a version and tell every active worker where to get it: its chain parent (or the learner's
    HTTP server), and which child its relay serves (docs/broadcast.md)."""
    _learner_may_report(job)
    if version <= job.published_version:
        raise ServiceError(f"version: {version} is not newer than the published {job.published_version}")
    snap = Snapshot.objects.create(job=job, version=version, url=url, manifest=manifest)
    Job.objects.filter(pk=job.pk).update(published_version=version)
    # A worker whose socket closed keeps its activation until it times out (it may reconnect), but it cannot
    # relay meanwhile: it is left out of the plan and gets the newest snapshot when it says hello again.
    active = list(Worker.objects.filter(activations__job=job, activations__ended_at=None)
                  .exclude(status=Worker.Status.OFFLINE).order_by("pk"))
    plan = broadcast_plan(job=job, workers=active, now=time.time())
    telemetry.save_chain_plan(job.pk, version, plan)
    snap.n_chains = len(plan.chains)  # the learner sizes its relay's fan-out from this (API reply)
    addresses = {w.pk: w.relay_address for w in active}
    for worker in active:
        _push_to_worker(worker.pk, _snapshot_message(snap, job=job, route=_route(plan, worker.pk), addresses=addresses))
    _push_job_update(job.pk)
    return snap


# ---- snapshot broadcast: chain plans and repair (paper section 4.2, appendix C.3 and D) -------------------


def _relaying(job: Job) -> bool:
    return job.broadcast_strategy == "chain" and bool(job.learner_relay)


def broadcast_plan(*, job: Job, workers: list[Worker], now: float) -> chains.ChainPlan:
    """The chain plan for ``workers`` (docs/broadcast.md "Chain assignment").

    Strategy ``chain`` with a learner relay: workers with a ``relay_address`` are scored and assembled into
    ``n_ch = n_chains(B0, median Bw)`` chains; a worker without one cannot serve a child, so it may only be a
    chain's tail (one per chain, after the relays); those left over, and workers the score drops, are
    rollout-only and fetch over HTTP. Star strategies, or no learner relay: everyone is rollout-only (HTTP).
    """
    if not _relaying(job) or not workers:
        return chains.ChainPlan(chains=(), rollout_only=tuple(w.pk for w in workers))
    n_ch = chains.n_chains(job.learner_uplink_bps, statistics.median(w.relay_bandwidth_bps for w in workers))
    relays = [w for w in workers if w.relay_address]
    stats = selectors.chain_stats(relays, now=now)
    plan = chains.assemble_chains(stats, n_ch=n_ch, now=now) if stats else chains.ChainPlan(chains=())
    built = [list(c) for c in plan.chains]
    rollout_only = list(plan.rollout_only)
    for worker in sorted((w for w in workers if not w.relay_address), key=lambda w: (-w.relay_bandwidth_bps, w.pk)):
        open_chain = next((c for c in sorted(built, key=len) if not c or c[-1] in {r.pk for r in relays}), None)
        if open_chain is not None:
            open_chain.append(worker.pk)
        elif len(built) < n_ch:
            built.append([worker.pk])
        else:
            rollout_only.append(worker.pk)
    return chains.ChainPlan(chains=tuple(tuple(c) for c in built if c), rollout_only=tuple(rollout_only))


def relay_failed(*, worker: Worker, job_id: int, version: int, culprit_worker_id: int | None, reason: str) -> None:
    """An agent's relay parent failed: count the failure against the parent, excise it from the plan
    (``chains.repair``) and re-point its orphaned child (and tell the new parent to serve it)."""
    activation = _running_activation(worker, job_id)
    job = activation.job
    plan = telemetry.load_chain_plan(job_id, version)
    log.warning("job %s v%s: worker %s reports relay parent %s failed: %s", job_id, version, worker.pk,
                culprit_worker_id if culprit_worker_id is not None else "learner", reason[:200])
    if plan is None or culprit_worker_id is None:
        return  # the learner's relay or an old plan: the agent falls back to HTTP on its own
    route = _route(plan, worker.pk)
    if route is None or route[0] != culprit_worker_id:
        raise ServiceError(f"culprit_worker_id: worker {culprit_worker_id} is not your parent for version {version}")
    Worker.objects.filter(pk=culprit_worker_id).update(relay_failures=F("relay_failures") + 1,
                                                       relay_last_failure_at=timezone.now())
    _excise(job, version, plan, culprit_worker_id)


def _excise(job: Job, version: int, plan: chains.ChainPlan, gone: int) -> None:
    """Take worker ``gone`` out of the chain plan of ``version`` (``chains.repair``) and re-point whoever
    pulled from it (telling each new parent which child to serve)."""
    new_plan, moves = chains.repair(plan, gone)
    telemetry.save_chain_plan(job.pk, version, new_plan)
    _push_job_update(job.pk)
    snap = Snapshot.objects.filter(job_id=job.pk, version=version).first()
    if snap is None:
        return
    ids = {c for c, _ in moves} | {p for _, p in moves if p is not None}
    addresses = dict(Worker.objects.filter(pk__in=ids).values_list("pk", "relay_address"))
    for child, new_parent in moves:
        log.info("job %s v%s: repair: worker %s now pulls from %s", job.pk, version, child,
                 new_parent if new_parent is not None else "the learner")
        for target in (child, new_parent):
            if target is not None:
                _push_to_worker(target, _snapshot_message(snap, job=job, route=_route(new_plan, target),
                                                          addresses=addresses))


def _repair_without(worker: Worker) -> None:
    """A worker went away (socket closed, or silent past the timeout): take it out of the newest chain plan
    of its running job at once, rather than when its orphaned child's transfer stalls (paper appendix D).
    Not counted as a relay failure: it may just be restarting."""
    activation = selectors.active_activation(worker=worker)
    job = activation.job if activation else None
    if job is None or job.status != Job.Status.RUNNING or not job.published_version:
        return
    plan = telemetry.load_chain_plan(job.pk, job.published_version)
    if plan is not None and any(worker.pk in chain for chain in plan.chains):
        log.info("job %s v%s: worker %s went away; repairing its chain", job.pk, job.published_version, worker.pk)
        _excise(job, job.published_version, plan, worker.pk)


def snapshot_installed(*, worker: Worker, job_id: int, version: int, seconds: float, source: str = "http") -> None:
    """Count an install; T_bcast is fixed once ceil(active/gamma) workers have the snapshot. An install
    received from a relay parent counts as a success for that parent (the chain score's Success term)."""
    activation = _running_activation(worker, job_id)
    Worker.objects.filter(pk=worker.pk).update(installed_version=version)
    with transaction.atomic():
        snap = Snapshot.objects.select_for_update().filter(job_id=job_id, version=version).first()
        if snap is None:
            raise ServiceError(f"version: snapshot {version} of job {job_id} was never published")
        snap.installs += 1
        fields = ["installs"]
        if source == "parent":
            snap.installs_via_parent += 1
            fields.append("installs_via_parent")
        active = activation.job.activations.filter(ended_at=None).count()
        if snap.t_bcast is None and snap.installs >= math.ceil(active / activation.job.gamma):
            snap.t_bcast = (timezone.now() - snap.published_at).total_seconds()
            fields.append("t_bcast")
        snap.save(update_fields=fields)
    if source == "parent":
        plan = telemetry.load_chain_plan(job_id, version)
        route = _route(plan, worker.pk) if plan else None
        if route is not None and route[0] is not None:
            _relay_succeeded(route[0], total_bytes=int(snap.manifest.get("total_bytes") or 0), seconds=seconds)
    _push_job_update(job_id)  # the page shows who has which version


BANDWIDTH_EWMA = 0.3  # weight of the newest transfer in a relay's measured bandwidth
BANDWIDTH_MIN_SECONDS = 1.0  # shorter transfers measure latency more than bandwidth: not taken


def _relay_succeeded(parent_id: int, *, total_bytes: int, seconds: float) -> None:
    """A child installed a snapshot through ``parent_id``: one more success (the score's Success term), and
    the rate the child saw, ``bytes / seconds since publication``, folded into the parent's Bw_hat when the
    transfer took at least ``BANDWIDTH_MIN_SECONDS`` (a 40 KB snapshot delivered in 20 ms "measures" 2 MB/s
    on a 100 MB/s link, and would split the fleet into needlessly many chains). Pipelining makes the rate a
    slight under-estimate of the link further down a chain, never an over-estimate."""
    with transaction.atomic():
        parent = Worker.objects.select_for_update().filter(pk=parent_id).first()
        if parent is None:
            return
        parent.relay_successes += 1
        fields = ["relay_successes"]
        if total_bytes > 0 and seconds >= BANDWIDTH_MIN_SECONDS:
            rate = total_bytes / seconds
            old = parent.measured_bandwidth_bps
            parent.measured_bandwidth_bps = rate if old is None else (1 - BANDWIDTH_EWMA) * old + BANDWIDTH_EWMA * rate
            fields.append("measured_bandwidth_bps")
        parent.save(update_fields=fields)


def _learner_may_report(job: Job) -> None:
    """The learner reports and publishes while the job runs or is paused (it trains what is queued)."""
    if job.status not in (Job.Status.RUNNING, Job.Status.PAUSED):
        raise ServiceError(f"status: job is {job.status}")


def metrics_record(*, job: Job, step: int, values: dict[str, Any]) -> JobMetric:
    _learner_may_report(job)
    known = {f.name for f in JobMetric._meta.get_fields()} - {"id", "job", "step", "created_at", "extra"}
    values = dict(values)
    extra = {**values.pop("extra", {}), **{k: v for k, v in values.items() if k not in known}}
    metric, _ = JobMetric.objects.update_or_create(
        job=job, step=step, defaults={**{k: v for k, v in values.items() if k in known}, "extra": extra},
    )
    Job.objects.filter(pk=job.pk).update(learner_step=step, learner_seen_at=timezone.now())
    job.refresh_from_db()
    _push_job_update(job)
    return metric
