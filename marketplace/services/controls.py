"""Providers' and owners' controls (docs/ledger.md "Provider and owner controls"): a worker's price (from now on),
pause, resume and removal; a job archived, brought back, or deleted. The ledger is never touched: a price change
bills the open activation up to its date at the old rate first, a removed worker is only unregistered, a job that
was billed is archived instead of deleted."""

from __future__ import annotations

import logging
import secrets
from decimal import Decimal

from django.db import transaction
from django.utils import timezone

from ..models import Activation, Job, LedgerEntry, PriceChange, Worker
from .base import ServiceError, push_job_update
from .billing import activation_observe
from .workers import worker_release

log = logging.getLogger(__name__)

MIN_PRICE, MAX_PRICE = Decimal("0.0001"), Decimal("999999.9999")


def _locked(worker: Worker) -> Worker:
    return Worker.objects.select_for_update(no_key=True).get(pk=worker.pk)


def _open_activation(worker: Worker) -> Activation | None:
    return Activation.objects.select_for_update(no_key=True).filter(worker=worker, ended_at=None).first()


@transaction.atomic
def worker_price_set(*, worker: Worker, price_per_hour: Decimal) -> Worker:
    """The worker's price from now on: its open activation is billed up to now at the old rate (what the site
    observed, as a release would), and its later intervals at the new one; the history keeps both with dates. The
    owner's job sees the new price at once (its page); a job whose ``requirements.max_price_per_hour`` the new price
    passes has the worker released now (and matching keeps it out afterwards)."""
    if not MIN_PRICE <= price_per_hour <= MAX_PRICE:
        raise ServiceError(f"price_per_hour: must be between {MIN_PRICE} and {MAX_PRICE} USD/h")
    worker = _locked(worker)
    if worker.removed_at is not None:
        raise ServiceError("worker: it was removed")
    now = timezone.now()
    activation = _open_activation(worker)
    if activation is not None:
        activation_observe(activation=activation, at=now,
                           reported="failed" if activation.state == "failed" else "idle")
        Activation.objects.filter(pk=activation.pk).update(price_per_hour=price_per_hour)
        push_job_update(activation.job_id)
        cap = activation.job.settings.requirements.max_price_per_hour
        if cap is not None and price_per_hour > Decimal(str(cap)):  # the owner pays no more than that: released now
            activation.refresh_from_db()
            worker_release(activation=activation, reason=f"price {price_per_hour} USD/h over the job's "
                           f"max_price_per_hour {cap}")
    worker.price_per_hour = price_per_hour
    worker.save(update_fields=["price_per_hour"])
    PriceChange.objects.create(worker=worker, price_per_hour=price_per_hour, at=now)
    log.info("worker %s: price %s USD/h from %s", worker.pk, price_per_hour, now.isoformat())
    return worker


def _release_open(worker: Worker, reason: str) -> None:
    """End the worker's activation cleanly: billed up to now by what the site saw, leases handed back."""
    activation = _open_activation(worker)
    if activation is not None:
        worker_release(activation=activation, reason=reason)


@transaction.atomic
def worker_pause(*, worker: Worker) -> Worker:
    """No new activations; its open one is released now (leases returned). Its agent may stay connected."""
    worker = _locked(worker)
    if worker.removed_at is not None:
        raise ServiceError("worker: it was removed")
    if worker.paused_at is None:
        worker.paused_at = timezone.now()
        worker.save(update_fields=["paused_at"])
    _release_open(worker, "paused by its provider")
    return worker


@transaction.atomic
def worker_resume(*, worker: Worker) -> Worker:
    """Activations again (the scheduler considers it at its next re-plan)."""
    worker = _locked(worker)
    if worker.removed_at is not None:
        raise ServiceError("worker: it was removed; register the machine again")
    worker.paused_at = None
    worker.save(update_fields=["paused_at"])
    return worker


@transaction.atomic
def worker_remove(*, worker: Worker) -> Worker:
    """Unregister: its open activation released, its agent key revoked (the agent is refused from now on), hidden
    from lists; the row stays, so its history and ledger entries still name it. Its name is free again."""
    worker = _locked(worker)
    if worker.removed_at is not None:
        return worker
    _release_open(worker, "removed by its provider")
    worker.removed_at = timezone.now()
    worker.key_hash = "removed-" + secrets.token_hex(28)  # no key hashes to this: the old key no longer works
    worker.name = f"{worker.name[:60]} (removed {worker.pk})"
    worker.status = Worker.Status.OFFLINE
    worker.save(update_fields=["removed_at", "key_hash", "name", "status"])
    return worker


@transaction.atomic
def job_archive(*, job: Job, archived: bool = True) -> Job:
    """Hide a job from lists (``archived=False``: show it again); its ledger and history stay. Only a job that is
    not running or paused: pause or cancel it first."""
    if archived and not (job.is_terminal or job.status == Job.Status.DRAFT):
        raise ServiceError(f"status: job is {job.status}; cancel it (or let it finish) before archiving it")
    job.archived_at = timezone.now() if archived else None
    job.save(update_fields=["archived_at"])
    push_job_update(job)
    return job


@transaction.atomic
def job_delete(*, job: Job) -> None:
    """Delete a job that never ran (no activation, no ledger entry); one that did is archived instead, so what was
    billed stays on the books."""
    if job.activations.exists() or LedgerEntry.objects.filter(job=job).exists() or job.started_at is not None:
        raise ServiceError(f"job: job {job.pk} has run (it has billed work or history); archive it instead")
    job.delete()
