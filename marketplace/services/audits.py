"""The learner's audits of workers' records (learner/audit.py, docs/trust.md "Audits"): stored per step, summed
per worker, and a worker that failed ``ECHO2["AUDIT_SUSPEND_AFTER"]`` audits is suspended with its provider
account: every worker of that provider is suspended and its open activations end (billing stops, its leases go
back), a worker the provider registers later starts suspended, and the scheduler never activates any of them
until staff lift the suspension (admin: the provider's "lift suspension" action).
Each outcome keeps what the learner checked (``evidence``, at most ``MAX_EVIDENCE`` groups per row).

Audits are the learner's word, taken as evidence only within what the site saw: the API takes them only with the
job's learner credential (``marketplace.api.auth.learner_problem``), and here only of workers the site accepted groups
from for this job, never more groups in all (passed and failed, over every step of the job) than it accepted from
that worker (``Activation.groups_accepted``, the site's own count: ``infra/delivered.py``; never the stream's Redis
counter). An owner cannot fail or launder another's worker through his own job.

Nor does a failure count on the learner's word: the site checks each against the group it stored and, for a reward,
re-scores it with the job's task (``services/audit_verify.py``, docs/trust.md "Audits the site checks"); a worker
is suspended after ``AUDIT_SUSPEND_AFTER`` failures that count (``Worker.audits_failed``)."""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Sum
from django.utils import timezone

from ..core import credits
from ..core.audit_checks import CONSISTENT, VERIFIED
from ..infra import delivered as delivered_counts
from ..models import Activation, Job, Provider, Worker, WorkerAudit
from ..reads.selectors import AUDIT_RELEASED
from .audit_verify import DECODE, PENDING, SEALED_LEASE, JobChecker, standing_text, worker_counted_failures
from .base import enqueue_task
from .billing import failed_work_credit
from .workers import worker_release

log = logging.getLogger(__name__)
MAX_EVIDENCE = 32  # groups' evidence kept per job, worker and step (the serializer's bound, after merging)


def audits_record(*, job: Job, step: int, results: list[dict[str, Any]]) -> None:
    """Store the audit outcomes the learner reported with ``step`` (idempotent per job, worker and step), refresh
    each worker's totals and suspend those past the limit. Runs inside the caller's transaction.

    Only what the site can vouch for counts: an audit of a worker that delivered no group to this job is ignored,
    and a worker's groups audited in this job (this step's with every other step's) are capped at the groups the
    site accepted from it, failures kept first. Both are logged."""
    results = _mergeable(results)
    delivered = _delivered(job, list(results)) if results else {}
    known = set(Worker.objects.filter(pk__in=list(results)).values_list("pk", flat=True))
    checker, pending = JobChecker(job), 0
    for worker_id, result in results.items():
        if worker_id not in known:  # a worker deleted since (or a learner's mistake): nothing to hold to account
            log.warning("job %s step %s: audit of unknown worker %s ignored", job.pk, step, worker_id)
            continue
        if not delivered.get(worker_id):
            log.warning("job %s step %s: audit of worker %s ignored: it delivered no group to this job", job.pk,
                        step, worker_id)
            continue
        earlier = WorkerAudit.objects.filter(job=job, worker_id=worker_id).exclude(step=step).aggregate(
            p=Sum("passed"), f=Sum("failed"))
        room = max(0, delivered[worker_id] - (earlier["p"] or 0) - (earlier["f"] or 0))
        failed = min(result["failed"], room)
        passed = min(result["passed"], room - failed)
        if (passed, failed) != (result["passed"], result["failed"]):
            log.warning("job %s step %s: audits of worker %s capped at the %d groups it delivered: %d passed, %d "
                        "failed (reported %d and %d)", job.pk, step, worker_id, delivered[worker_id], passed, failed,
                        result["passed"], result["failed"])
        if not passed and not failed:
            continue
        checked = checker.check(worker_id=worker_id, step=step, failed=failed,
                                evidence=result["evidence"][:MAX_EVIDENCE])
        WorkerAudit.objects.update_or_create(job=job, worker_id=worker_id, step=step, defaults={
            "passed": passed, "failed": failed, "dropped_records": result["dropped_records"],
            "reason": result.get("reason", ""), "evidence": checked.evidence, **checked.fields()})
        if failed:
            _release_from_job(job, worker_id, step=step, failed=failed)
        worker_audits_settle(job=job, worker_id=worker_id, evidence=checked.evidence, failed=failed > 0,
                             reason=result.get("reason", ""), what=f"step {step}")
        pending += checked.pending
    if pending:  # the site decodes these text failures itself, off this request (and any earlier still pending)
        enqueue_task("audit_texts_decode", job.pk)


def worker_audits_settle(*, job: Job, worker_id: int, evidence: list[dict[str, Any]], failed: bool, reason: str,
                         what: str) -> None:
    """A worker's audits in ``job`` were checked (``evidence``: those just checked, at a report or once the site
    decoded their texts; ``failed``: failures among them): its totals again and, after failures, the owner credited
    the failed work the site confirmed and the worker suspended if it is past the limit."""
    passes = WorkerAudit.objects.filter(worker_id=worker_id).aggregate(p=Sum("passed"))["p"] or 0
    counted, figures = worker_counted_failures(worker_id)
    Worker.objects.filter(pk=worker_id).update(audits_passed=passes, audits_failed=counted)
    if not failed:
        return
    _credit_failed_work(job, worker_id, evidence)
    log.info("job %s %s: worker %s audits checked by the site: %s", job.pk, what, worker_id,
             standing_text(figures, limit=int(settings.ECHO2["AUDIT_SUSPEND_AFTER"])))
    _suspend_if_due(worker_id, failures=counted, reason=_last_counted(evidence, reason), figures=figures)


def groups_accepted_flush() -> None:
    """Write the groups this process accepted since its last flush (``infra.delivered``) into
    ``Activation.groups_accepted``: each (job, worker)'s newest activation, in one transaction; a failed write keeps
    them for the next flush. A few statements whatever the number of workers (the activations read at once, locked
    in id order, one update per distinct count): a statement per worker made 2,000 a flush at 1,000 workers, and
    held their rows against the billing fold the while."""
    counts = delivered_counts.take()
    if not counts:
        return
    try:
        with transaction.atomic():
            newest: dict[tuple[int, int], tuple] = {}
            rows = Activation.objects.filter(job_id__in={j for j, _ in counts}, worker_id__in={w for _, w in counts})
            for job_id, worker_id, started_at, pk in rows.values_list("job_id", "worker_id", "started_at", "pk"):
                if (job_id, worker_id) in counts and (started_at, pk) > newest.get((job_id, worker_id), (started_at,)):
                    newest[(job_id, worker_id)] = (started_at, pk)
            by_count: dict[int, list[int]] = {}
            for pair, (_, pk) in newest.items():
                by_count.setdefault(counts[pair], []).append(pk)
            list(Activation.objects.select_for_update(no_key=True).filter(
                pk__in=[pk for _, pk in newest.values()]).order_by("pk").values_list("pk"))
            for groups, ids in sorted(by_count.items()):
                Activation.objects.filter(pk__in=ids).update(groups_accepted=F("groups_accepted") + groups)
    except Exception:
        delivered_counts.give_back(counts)
        raise


def _delivered(job: Job, worker_ids: list[int]) -> dict[int, int]:
    """The groups the site accepted from each of ``worker_ids`` in ``job``, by its own count in the database (this
    process's latest first written there), never the stream's Redis counter a learner could write."""
    groups_accepted_flush()
    rows = (Activation.objects.filter(job=job, worker_id__in=worker_ids).values("worker_id")
            .annotate(groups=Sum("groups_accepted")))
    return {row["worker_id"]: row["groups"] or 0 for row in rows}


def _release_from_job(job: Job, worker_id: int, *, step: int, failed: int) -> None:
    """The owner's learner failed groups of this worker: its part in the job ends now (billing stops, leases go
    back) and the scheduler plans it for this job no more (``selectors.excluded_workers``). On the owner's word
    alone, for his own job: nothing changes for the worker elsewhere unless the site verified the failure."""
    held = Activation.objects.select_for_update(no_key=True).filter(job=job, worker_id=worker_id, ended_at=None)
    for activation in held:
        worker_release(activation=activation, reason=f"{AUDIT_RELEASED}{failed} group(s) failed at step {step}; "
                                                     "not planned for this job again")
        log.info("job %s step %s: worker %s released from the job after %d failed audit(s)", job.pk, step,
                 worker_id, failed)


def _credit_failed_work(job: Job, worker_id: int, evidence: list[dict[str, Any]]) -> None:
    """The owner pays nothing for the failed groups the site checked against what it stored (verified or
    consistent: a real, sealed group of this worker): the billed time they were generated in is credited back
    (``billing.failed_work_credit``). A failure the site refused or could not check (record gone, no seal, no
    evidence) gives nothing back: the owner's word alone moves no money from a provider; nor does a text failure
    the site is still to decode (it may yet be refused)."""
    timeout = float(settings.ECHO2["LEASE_TIMEOUT_S"])
    confirmed = [e for e in evidence if not e.get("passed") and e.get("site") in (VERIFIED, CONSISTENT)
                 and e.get(DECODE) != PENDING and e.get(SEALED_LEASE)]
    windows = [w for e in confirmed if (w := credits.failure_window(entry_id=e["entry_id"], lease_id=e[SEALED_LEASE],
                                                                    lease_timeout_s=timeout)) is not None]
    failed_work_credit(job_id=job.pk, worker_id=worker_id, windows=windows, now=timezone.now())


def _mergeable(results: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """One outcome per worker: a report naming a worker twice is summed (so it cannot pass the cap twice)."""
    merged: dict[int, dict[str, Any]] = {}
    for result in results:
        into = merged.setdefault(result["worker_id"], {"passed": 0, "failed": 0, "dropped_records": 0, "reason": "",
                                                       "evidence": []})
        for field in ("passed", "failed", "dropped_records"):
            into[field] += result.get(field, 0)
        into["evidence"] += result.get("evidence", [])
        into["reason"] = result.get("reason", "") or into["reason"]
    return merged


def _last_counted(evidence: list[dict[str, Any]], reason: str) -> str:
    """The learner's reason with the site's word on the last failure that may count."""
    counting = [e for e in evidence if e.get("site") in ("verified", "consistent")]
    return f"{reason} [{counting[-1]['site']}: {counting[-1]['site_reason']}]" if counting else reason


def _suspend_if_due(worker_id: int, *, failures: int, reason: str, figures: dict[str, Any]) -> None:
    limit = int(settings.ECHO2["AUDIT_SUSPEND_AFTER"])
    if failures < limit or Worker.objects.filter(pk=worker_id, suspended_at__isnull=False).exists():
        return
    why = (f"suspended after {failures} failed audits (limit {limit}); last: {reason[:250]}; "
           f"{standing_text(figures, limit=limit)}")[:600]
    provider_suspend(provider=Provider.objects.get(workers=worker_id), worker_id=worker_id, reason=why)


def provider_suspend(*, provider: Provider, worker_id: int, reason: str) -> None:
    """Suspend ``provider``'s account for its worker ``worker_id`` (``reason``): that worker and every other worker
    of the account are suspended, and their open activations end (billing stops, leases go back). A worker the
    provider registers later starts suspended (``services.workers.worker_register``)."""
    now = timezone.now()
    Worker.objects.filter(pk=worker_id).update(suspended_at=now, suspended_reason=reason)
    Worker.objects.filter(provider=provider, suspended_at__isnull=True).update(
        suspended_at=now, suspended_reason=f"provider suspended: worker {worker_id} {reason}"[:600])
    Provider.objects.filter(pk=provider.pk, suspended_at__isnull=True).update(
        suspended_at=now, suspended_reason=f"worker {worker_id} {reason}"[:600])
    log.warning("worker %s %s; its provider %s is suspended with every worker", worker_id, reason, provider.pk)
    for activation in Activation.objects.filter(worker__provider=provider, ended_at=None).order_by("worker_id"):
        worker_release(activation=activation, reason="suspended: failed audits" if activation.worker_id == worker_id
                       else f"suspended: provider's worker {worker_id} failed audits")


def provider_lift_suspension(*, provider: Provider) -> None:
    """Staff lift a provider's suspension (admin): the account and every worker of it may be planned again."""
    Provider.objects.filter(pk=provider.pk).update(suspended_at=None, suspended_reason="")
    Worker.objects.filter(provider=provider).update(suspended_at=None, suspended_reason="")
    log.warning("provider %s: suspension lifted by staff", provider.pk)
