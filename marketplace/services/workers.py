"""Providers' machines: registration, calibration, the agent's connection (hello, heartbeats, close, silence)
and its activations in jobs (billing starts and ends here)."""

from __future__ import annotations

import logging
import secrets
from datetime import datetime
from decimal import Decimal

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from dataplane import messages as m
from dataplane.replay import RedisError
from dataplane.tasks import TaskSpecError, build_task

from .. import billing, selectors, stream, telemetry
from ..models import Activation, Job, Provider, Worker, WorkerCalibration, WorkerSession
from .base import ServiceError, enqueue_task, push_job_update, push_to_worker
from .billing import activation_report
from .broadcast import assign_message, repair_without

log = logging.getLogger(__name__)


@transaction.atomic
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


@transaction.atomic
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
    return calibration


def _session_open(worker_id: int, *, at: datetime) -> WorkerSession:
    """Start a connection session (uptime). A session still open is stale: the site missed its end (a crash,
    or the agent reconnected before the old socket's close arrived); it ends at the worker's last heartbeat,
    the last moment the site knew the agent was there."""
    stale = WorkerSession.objects.select_related("worker").filter(worker_id=worker_id, ended_at=None).first()
    if stale is not None:
        _session_close(worker_id, at=stale.worker.last_heartbeat or stale.started_at)
    return WorkerSession.objects.create(worker_id=worker_id, started_at=at)


def _session_close(worker_id: int, *, at: datetime) -> None:
    """End the worker's open session at ``at`` (never before it started)."""
    for session in WorkerSession.objects.filter(worker_id=worker_id, ended_at=None):
        session.ended_at = max(at, session.started_at)
        session.save(update_fields=["ended_at"])


@transaction.atomic
def worker_connected(*, worker: Worker, installed_version: int | None, at: datetime | None = None) -> list[m._Msg]:
    """An agent said hello (at ``at``, default now): mark it live and open its session; re-send its assignment
    if it is active in a job. With the install report, the one place that sets ``installed_version``."""
    activation = selectors.active_activation(worker=worker)
    now = at or timezone.now()
    _session_open(worker.pk, at=now)
    worker.status = Worker.Status.ACTIVE if activation else Worker.Status.IDLE
    worker.last_heartbeat = now
    worker.installed_version = installed_version
    worker.save(update_fields=["status", "last_heartbeat", "installed_version"])
    replies: list[m._Msg] = [m.Welcome(worker_id=worker.pk, heartbeat_interval=settings.ECHO2["HEARTBEAT_INTERVAL_S"],
                                       max_message_bytes=settings.ECHO2["WS_MAX_MESSAGE_BYTES"])]
    if activation:
        replies.append(assign_message(activation.job, worker_id=worker.pk))
    else:
        enqueue_task("provision_waiting_jobs")  # a new idle worker may be what a running job waits for
    return replies


@transaction.atomic
def worker_heartbeat(*, worker: Worker, throughput: float | None, state: str = "idle", reason: str = "",
                     job_id: int | None = None) -> None:
    """Refresh the worker's liveness and throughput; a heartbeat from a worker marked offline brings it back.
    The ``state`` it reports doing for ``job_id`` bills its activation (``_bill_state``).

    Whether it was offline is asked of the database, not of ``worker``: the consumer's copy is as old as the
    socket, and expiry may have marked the worker offline since (the agent stalled, then resumed). The
    version the agent says it has installed is not taken from heartbeats: only the hello and the install
    report set it, so a heartbeat sent just after a release cannot erase the record of what was installed.
    """
    now = timezone.now()
    telemetry.record_heartbeat(worker.pk, at=now.timestamp(), throughput=throughput)
    fields: dict = {"last_heartbeat": now}
    activation = selectors.active_activation(worker=worker)
    if activation is not None:  # mu_i is what the site accepted from it, never the figure it claims
        measured = telemetry.measure_worker(worker.pk, job_id=activation.job_id,
                                            since=activation.started_at.timestamp(), now=now.timestamp())
        if measured is not None:
            fields["throughput"] = measured
    if Worker.objects.filter(pk=worker.pk, status=Worker.Status.OFFLINE).exists():
        fields["status"] = Worker.Status.ACTIVE if activation is not None else Worker.Status.IDLE
        _session_open(worker.pk, at=now)
    Worker.objects.filter(pk=worker.pk).update(**fields)
    if activation is not None:
        _bill_state(activation, at=now, state=billing.effective_state(
            reported=state, reported_job_id=job_id, job_id=activation.job_id), reason=reason)


def _bill_state(activation: Activation, *, at: datetime, state: str, reason: str) -> None:
    """Bill the activation up to ``at`` and record its new state; a worker whose rollout loop has been failing
    for ``ROLLOUT_FAILED_RELEASE_S`` is released, and its job re-planned so the scheduler can activate another."""
    changed = activation.state != state
    updated = activation_report(activation_id=activation.pk, at=at, state=state, reason=reason)
    if updated is None:
        return
    if changed:
        push_job_update(activation.job_id)  # the job page shows each worker's state
    limit = settings.ECHO2["ROLLOUT_FAILED_RELEASE_S"]
    if billing.failing_too_long(state=updated.state, since=updated.state_since.timestamp(), now=at.timestamp(),
                                limit_s=limit):
        log.warning("job %s: worker %s's rollout loop has failed for %.0f s (%s); releasing it", activation.job_id,
                    activation.worker_id, limit, updated.state_reason)
        worker_release(activation=updated, reason=f"rollout loop failing for {limit:.0f} s: "
                                                  f"{updated.state_reason}"[:200])
        enqueue_task("replan_job", activation.job_id)


@transaction.atomic
def worker_disconnected(*, worker: Worker, since: datetime | None = None) -> None:
    """The socket whose session began at ``since`` (its hello) closed: the session ends now and the worker
    leaves the chains. The activation stays open for a reconnect until the worker times out. When the agent
    has already said hello on a newer socket (an open session began after ``since``), this close is old
    news and changes nothing."""
    if since is not None and WorkerSession.objects.filter(
            worker_id=worker.pk, ended_at=None, started_at__gt=since).exists():
        return
    now = timezone.now()
    Worker.objects.filter(pk=worker.pk).update(status=Worker.Status.OFFLINE)
    _session_close(worker.pk, at=now)
    for activation in Activation.objects.filter(worker_id=worker.pk, ended_at=None):
        activation_report(activation_id=activation.pk, at=now, state="idle")  # a closed socket delivers nothing
    repair_without(worker)


@transaction.atomic
def worker_activate(*, worker: Worker, job: Job) -> Activation:
    """Start billing ``worker`` for ``job`` and send it the assignment (never a worker suspended for audits)."""
    if Worker.objects.filter(pk=worker.pk, suspended_at__isnull=False).exists():
        raise ServiceError(f"worker {worker.pk} is suspended (failed audits) and cannot be activated")
    activation = Activation.objects.create(job=job, worker=worker, price_per_hour=worker.price_per_hour)
    Worker.objects.filter(pk=worker.pk).update(status=Worker.Status.ACTIVE)
    push_to_worker(worker.pk, assign_message(job, worker_id=worker.pk))
    push_job_update(job.pk)
    log.info("job %s: activated worker %s at $%s/h", job.pk, worker.name, worker.price_per_hour)
    return activation


@transaction.atomic
def worker_release(*, activation: Activation, reason: str) -> None:
    """Stop billing the activation (its time since the last state report billed as that state) and tell the
    agent to stop generating for its job."""
    activation.ended_at = timezone.now()
    activation.end_reason = reason
    billed = activation_report(activation_id=activation.pk, at=activation.ended_at)
    activation.billed_seconds = billed.billed_seconds if billed else activation.billed_seconds
    activation.save(update_fields=["ended_at", "end_reason"])
    Worker.objects.filter(pk=activation.worker_id, status=Worker.Status.ACTIVE).update(status=Worker.Status.IDLE)
    push_to_worker(activation.worker_id, m.Release(job_id=activation.job_id, reason=reason))
    push_job_update(activation.job_id)
    transaction.on_commit(lambda: _return_leases(activation.job_id, activation.worker_id))


def _return_leases(job_id: int, worker_id: int) -> None:
    """A released worker's leases go back to the pool at once, not after the lease timeout (best effort:
    with Redis away they still come back when they time out)."""
    try:
        returned = stream.replay(job_id).return_leases(worker_id=worker_id)
    except RedisError as err:
        log.warning("job %s: worker %s's leases not returned now (Redis: %s); they expire", job_id, worker_id, err)
        return
    if returned:
        log.info("job %s: worker %s released; %d leased prompts returned", job_id, worker_id, returned)


def expire_silent_workers() -> int:
    """Mark workers silent for longer than WORKER_TIMEOUT_S offline and end their sessions and activations
    (one transaction per worker)."""
    cutoff = timezone.now() - timezone.timedelta(seconds=settings.ECHO2["WORKER_TIMEOUT_S"])
    silent = Worker.objects.exclude(status=Worker.Status.OFFLINE).filter(last_heartbeat__lt=cutoff)
    count = 0
    for worker in silent:
        with transaction.atomic():
            worker.status = Worker.Status.OFFLINE
            worker.save(update_fields=["status"])
            _session_close(worker.pk, at=worker.last_heartbeat)  # it went silent then, not now
            repair_without(worker)  # before the release ends the activation that names its job
            for activation in Activation.objects.filter(worker=worker, ended_at=None):
                worker_release(activation=activation, reason="worker stopped sending heartbeats")
        count += 1
    # Offline workers whose activation is still open (socket closed long ago) are released too.
    for activation in Activation.objects.filter(ended_at=None, worker__status=Worker.Status.OFFLINE,
                                                worker__last_heartbeat__lt=cutoff):
        worker_release(activation=activation, reason="worker disconnected")
    return count
