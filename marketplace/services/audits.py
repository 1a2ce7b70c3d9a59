"""The learner's audits of workers' records (learner/audit.py, docs/trust.md "Audits"): stored per step, summed
per worker, and a worker that failed ``ECHO2["AUDIT_SUSPEND_AFTER"]`` audits is suspended: its open activation
ends (billing stops, its leases go back), and the scheduler never activates it again until staff lift the
suspension (admin: clear ``suspended_at``)."""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.db.models import Sum
from django.utils import timezone

from ..models import Activation, Job, Worker, WorkerAudit
from .workers import worker_release

log = logging.getLogger(__name__)


def audits_record(*, job: Job, step: int, results: list[dict[str, Any]]) -> None:
    """Store the audit outcomes the learner reported with ``step`` (idempotent per job, worker and step), refresh
    each worker's totals and suspend those past the limit. Runs inside the caller's transaction."""
    known = set(Worker.objects.filter(pk__in=[r["worker_id"] for r in results]).values_list("pk", flat=True))
    for result in results:
        worker_id = result["worker_id"]
        if worker_id not in known:  # a worker deleted since (or a learner's mistake): nothing to hold to account
            log.warning("job %s step %s: audit of unknown worker %s ignored", job.pk, step, worker_id)
            continue
        WorkerAudit.objects.update_or_create(job=job, worker_id=worker_id, step=step, defaults={
            "passed": result["passed"], "failed": result["failed"], "dropped_records": result["dropped_records"],
            "reason": result.get("reason", "")})
        totals = WorkerAudit.objects.filter(worker_id=worker_id).aggregate(p=Sum("passed"), f=Sum("failed"))
        Worker.objects.filter(pk=worker_id).update(audits_passed=totals["p"] or 0, audits_failed=totals["f"] or 0)
        if result["failed"]:
            _suspend_if_due(worker_id, failures=totals["f"] or 0, reason=result.get("reason", ""))


def _suspend_if_due(worker_id: int, *, failures: int, reason: str) -> None:
    limit = int(settings.ECHO2["AUDIT_SUSPEND_AFTER"])
    if failures < limit or Worker.objects.filter(pk=worker_id, suspended_at__isnull=False).exists():
        return
    why = f"suspended after {failures} failed audits (limit {limit}); last: {reason}"[:600]
    Worker.objects.filter(pk=worker_id).update(suspended_at=timezone.now(), suspended_reason=why)
    log.warning("worker %s %s", worker_id, why)
    for activation in Activation.objects.filter(worker_id=worker_id, ended_at=None):
        worker_release(activation=activation, reason="suspended: failed audits")
