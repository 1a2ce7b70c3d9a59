"""Providers' machines: registration, calibration, and their activations in jobs (billing starts and ends here).

The agent's connection (hello, heartbeats, close, silence) is ``presence``."""

from __future__ import annotations

import logging
import secrets
from decimal import Decimal

from django.db import IntegrityError, transaction
from django.utils import timezone

from dataplane import messages as m
from dataplane.hardware import Hardware
from dataplane.replay import RedisError
from dataplane.tasks import TaskSpecError, build_task

from ..infra import liveness, stream, telemetry
from ..models import Activation, Job, PriceChange, Provider, Worker, WorkerCalibration
from ..reads import matching, selectors
from .base import ServiceError, push_job_update, push_to_worker
from .billing import Observation, activation_observe, activations_bill
from .broadcast import assign_messages

log = logging.getLogger(__name__)

@transaction.atomic
def worker_register(*, user, name: str, gpu: str, price_per_hour: Decimal, bandwidth_bps: int,
                    relay_address: str = "", hardware: Hardware | None = None) -> tuple[Worker, str]:
    """Register a machine for ``user`` (made a provider if needed), with the ``hardware`` its agent measured;
    returns the worker and its agent key.

    The key is shown once: only its hash is stored.
    """
    provider, _ = Provider.objects.get_or_create(user=user, defaults={"display_name": user.get_username()})
    key = "e2w_" + secrets.token_urlsafe(32)
    try:
        with transaction.atomic():
            worker = Worker.objects.create(
                provider=provider, name=name, gpu=gpu, price_per_hour=price_per_hour, bandwidth_bps=bandwidth_bps,
                relay_address=relay_address, key_hash=selectors.hash_key(key),
                hardware=hardware.model_dump() if hardware else {}, hardware_at=timezone.now() if hardware else None,
                # a suspended provider's new worker starts suspended (services/audits.py provider_suspend)
                suspended_at=provider.suspended_at, suspended_reason=provider.suspended_reason and
                f"provider suspended: {provider.suspended_reason}"[:600],
            )
    except IntegrityError:
        raise ServiceError(f"name: you already have a worker named {name!r}") from None
    PriceChange.objects.create(worker=worker, price_per_hour=price_per_hour, at=worker.created_at)
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


def _activation_refusals(job: Job, ids: list[int]) -> dict[int, str]:
    """Why each of ``ids`` that cannot be activated for ``job`` cannot (three queries whatever their number):
    suspended for failed audits, paused or removed by its provider, or opted out of owners' code the job runs."""
    out = {pk: f"worker {pk} is suspended (failed audits) and cannot be activated"
           for pk in Worker.objects.filter(pk__in=ids, suspended_at__isnull=False).values_list("pk", flat=True)}
    for pk in Worker.objects.filter(pk__in=ids).exclude(paused_at=None, removed_at=None).values_list("pk", flat=True):
        out.setdefault(pk, f"worker {pk} is paused or removed by its provider and cannot be activated")
    opted_out = list(Worker.objects.filter(pk__in=ids, allow_user_code=False).values_list("pk", flat=True))
    if opted_out and (code := matching.user_code_of(job.task)):
        for pk in opted_out:
            out.setdefault(pk, f"worker {pk}'s provider does not run job owners' code, and job {job.pk} runs "
                               f"{', '.join(code)} (docs/trust.md, \"User code on workers\")")
    return out


@transaction.atomic
def worker_activate(*, worker: Worker, job: Job) -> Activation:
    """Start billing ``worker`` for ``job`` and send it the assignment (never a worker suspended for audits: a
    refusal raises ``ServiceError``)."""
    if refusal := _activation_refusals(job, [worker.pk]).get(worker.pk):
        raise ServiceError(refusal)
    return _activate(job, [worker])[0]


@transaction.atomic
def workers_activate(*, job: Job, workers: list[Worker]) -> list[Activation]:
    """``worker_activate`` of many workers at once (the calibration phase: every idle worker that qualifies, and a
    re-plan's), in a fixed number of statements whatever their number. One that ``worker_activate`` would refuse is
    left out and logged. One by one, each activation took 9 statements (three checks, an insert, an update, two
    snapshot reads, and its savepoint)."""
    refusals = _activation_refusals(job, [w.pk for w in workers])
    for refusal in refusals.values():
        log.info("job %s: %s; not activated", job.pk, refusal)
    chosen = [w for w in workers if w.pk not in refusals]
    return _activate(job, chosen) if chosen else []


def _activate(job: Job, workers: list[Worker]) -> list[Activation]:
    """Activate ``workers`` (none refused) for ``job``: their activations created together, their status set in one
    statement, the job's snapshots read once for their assignments, their heartbeat states forgotten in one Redis
    round trip (their next heartbeats bill the new activations)."""
    chosen = sorted(workers, key=lambda w: w.pk)
    activations = Activation.objects.bulk_create(
        [Activation(job=job, worker=w, price_per_hour=w.price_per_hour) for w in chosen])
    Worker.objects.filter(pk__in=[w.pk for w in chosen]).update(status=Worker.Status.ACTIVE)
    for worker_id, assign in assign_messages(job, [w.pk for w in chosen]).items():
        push_to_worker(worker_id, assign)
    push_job_update(job.pk)
    transaction.on_commit(lambda: liveness.forget_states([w.pk for w in chosen]))
    log.info("job %s: activated %s%s", job.pk, ", ".join(f"{w.name} at ${w.price_per_hour}/h" for w in chosen[:20]),
             f" and {len(chosen) - 20} more" if len(chosen) > 20 else "")
    return activations


@transaction.atomic
def worker_release(*, activation: Activation, reason: str, code: str = Activation.End.OTHER,
                   return_leases: bool = True) -> None:
    """Stop billing the activation (its time since the last report billed by what the site observed:
    ``activation_observe``) and tell the agent to stop generating for its job. Why: ``reason`` in words, ``code``
    as a code (``Activation.End``) the site acts on. ``return_leases``: as :func:`workers_release`'s."""
    activation.ended_at = timezone.now()
    activation.end_reason, activation.end_code = reason, code
    offline = Worker.objects.filter(pk=activation.worker_id, status=Worker.Status.OFFLINE).exists()
    billed = activation_observe(activation=activation, at=activation.ended_at,  # an offline worker's lease: free
                                reported="failed" if activation.state == "failed" else "idle", connected=not offline)
    activation.billed_seconds = billed.billed_seconds if billed else activation.billed_seconds
    activation.save(update_fields=["ended_at", "end_reason", "end_code"])
    Worker.objects.filter(pk=activation.worker_id, status=Worker.Status.ACTIVE).update(status=Worker.Status.IDLE)
    push_to_worker(activation.worker_id, m.Release(job_id=activation.job_id, reason=reason))
    push_job_update(activation.job_id)
    if return_leases:
        transaction.on_commit(lambda: _return_leases(activation.job_id, activation.worker_id))


def workers_release(*, job_id: int, activations: list[Activation], reason: str,
                    code: str = Activation.End.OTHER, return_leases: bool = True) -> None:
    """``worker_release`` of many open activations of job ``job_id`` at once (its end or pause, a re-plan's
    surplus), in worker id order: billed together by ``activations_bill`` (what ``activation_observe`` bills one at a
    time, to the last digit, in a fixed number of statements) and ended in one statement; one whose row another
    transaction holds now (a heartbeat's report) is released alone, as before. A Cancel of a thousand workers made
    each release's half a dozen queries one after another: ~40 s on a loaded site, near its caller's HTTP timeout.
    Call it in the transaction that ends them: the rows billed here stay locked until it commits. ``return_leases``:
    hand the workers' leased prompts back at once (else they come back when their leases time out)."""
    if not activations:
        return
    at = timezone.now()
    ids = [a.worker_id for a in activations]
    offline = set(Worker.objects.filter(pk__in=ids, status=Worker.Status.OFFLINE).values_list("pk", flat=True))
    seen = telemetry.observed(ids, job_id=job_id)
    bills = activations_bill(job_id=job_id, at=at, observations=[  # an offline worker's lease: free
        Observation(activation_id=a.pk, worker_id=a.worker_id, seen=seen[a.worker_id],
                    reported="failed" if a.state == "failed" else "idle", connected=a.worker_id not in offline)
        for a in activations])
    together = [a for a in activations if a.pk in bills]
    Activation.objects.filter(pk__in=[a.pk for a in together]).update(ended_at=at, end_reason=reason, end_code=code)
    Worker.objects.filter(pk__in=[a.worker_id for a in together], status=Worker.Status.ACTIVE).update(
        status=Worker.Status.IDLE)
    for activation in together:
        push_to_worker(activation.worker_id, m.Release(job_id=job_id, reason=reason))
    push_job_update(job_id)
    if return_leases:  # False: the job's streams go with its end, leases and all (two round trips a worker saved)
        transaction.on_commit(lambda: [_return_leases(job_id, a.worker_id) for a in together])
    for activation in activations:
        if activation.pk not in bills:  # held elsewhere, or billed up to now already: alone, waiting for its row
            worker_release(activation=activation, reason=reason, code=code, return_leases=return_leases)


def _return_leases(job_id: int, worker_id: int, *, why: str = "released") -> None:
    """A released (or disconnected) worker's leases go back to the pool at once, not after the lease timeout
    (best effort: with Redis away they still come back when they time out)."""
    try:
        returned = stream.replay(job_id).return_leases(worker_id=worker_id)
    except RedisError as err:
        log.warning("job %s: worker %s's leases not returned now (Redis: %s); they expire", job_id, worker_id, err)
        return
    if returned:
        log.info("job %s: worker %s %s; %d leased prompts returned", job_id, worker_id, why, returned)
