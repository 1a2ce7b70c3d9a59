"""The site checks the failures a learner reports before any counts (docs/trust.md "Audits the site checks"): each
failure's evidence against the group the site stored (``dataplane.audit_hold``: the held copy, or the stream
entry), believed only under the site's seal (``dataplane.seal``, ``marketplace/infra/group_seal.py``) and, for a
reward, the job's task run by the site itself (``marketplace/core/audit_checks.py``); a text failure whose claimed
text is the worker's is decoded with the job's tokenizer after the report (``services/audit_texts.py``).

What counts toward a worker's suspension (:func:`worker_counted_failures`): every failure the site verified, and
the consistent log-prob and text failures only once learners of ``ECHO2["AUDIT_CORROBORATING_OWNERS"]`` (default 0:
never) distinct owners reported such, one per owner."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db.models import Sum

from dataplane.audit_hold import held_entries
from dataplane.stored import field as stored_field
from dataplane.stored import stored_entry, text

from ..core import audit_checks as checks
from ..core.audit_checks import REFUSED, UNVERIFIED, SiteCheck
from ..infra import group_seal, stream
from ..models import Job, Worker, WorkerAudit

log = logging.getLogger(__name__)
CORROBORATING_OWNERS = 0  # the default of ECHO2["AUDIT_CORROBORATING_OWNERS"]: unverified claims never count
SEALED_LEASE = "sealed_lease"  # an evidence item's key: the lease of the sealed group it was checked against
# An evidence item's key: where the site's own decoding of a text failure stands (services/audit_texts.py): pending
# (the verdict is consistent until then), done (the verdict is the decode's), failed (no tokenizer: why, in the reason)
DECODE, PENDING, DECODED, NOT_DECODED = "site_decode", "pending", "done", "failed"
SITE_KEYS = (SEALED_LEASE, DECODE)  # what only the site writes into an evidence item


@dataclass
class Checked:
    """One worker's reported failures of one step, as the site checked them."""

    evidence: list[dict[str, Any]]  # the learner's evidence, each failure with ``site`` and ``site_reason``
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys((checks.VERIFIED, checks.CONSISTENT,
                                                                           UNVERIFIED, REFUSED), 0))

    @property
    def pending(self) -> int:
        """Text failures the site decodes next (services/audit_texts.py)."""
        return sum(e.get(DECODE) == PENDING for e in self.evidence)

    def fields(self) -> dict[str, int]:
        return {f"failed_{status}": n for status, n in self.counts.items()}


class JobChecker:
    """The checks of one report: the job's task built once, the stored groups read in one round trip per worker."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self._scorer: tuple[Any, str] | None = None

    def scorer(self) -> tuple[Any, str]:
        if self._scorer is None:
            self._scorer = checks.site_scorer(self.job.settings.task)
        return self._scorer

    def check(self, *, worker_id: int, step: int, failed: int, evidence: list[dict[str, Any]]) -> Checked:
        """Check the ``failed`` failures reported of ``worker_id`` with ``step`` (their items in ``evidence``;
        those beyond the items came without evidence). A failure item already checked in this row (the report sent
        again) keeps its verdict; an entry reported in another step of the job is refused (counted once)."""
        before = {e.get("entry_id"): e for e in _row_evidence(self.job, worker_id, step) if "site" in e}
        elsewhere = _entries_reported(self.job, worker_id, exclude_step=step)
        failures = [e for e in evidence if not e.get("passed")][:failed]
        stored = held_entries(stream.client(), self.job.pk, [e["entry_id"] for e in failures
                                                             if e["entry_id"] not in before])
        keys = group_seal.verifying_keys()
        kept = {(SEALED_LEASE, e[SEALED_LEASE]): entry for entry, e in before.items()  # this row's, kept
                if e.get(SEALED_LEASE) and e["site"] != REFUSED}
        out, seen, chosen = Checked(evidence=[]), set(), {id(e) for e in failures}
        # an entry's verdict is the site's about that group: a report sent again (or a changed item about the same
        # entry) keeps it, even once the held copy has expired
        for item in evidence:
            if item.get("passed"):
                out.evidence.append(item)
                continue
            if id(item) not in chosen:  # past the failures counted (the cap at what the worker delivered)
                continue
            entry, sealed = item["entry_id"], {}
            if entry in seen or entry in elsewhere:
                verdict = SiteCheck(REFUSED, f"entry {entry} was reported failed already")
            elif entry in before:
                verdict = SiteCheck(before[entry]["site"], before[entry].get("site_reason", ""))
                sealed = {k: before[entry][k] for k in SITE_KEYS if before[entry].get(k)}
            else:
                verdict, sealed = self._check_stored(item, stored.get(entry), worker_id=worker_id, keys=keys)
                lease = (SEALED_LEASE, sealed.get(SEALED_LEASE))  # apart from entry ids: both are stream ids
                if sealed and (lease in seen or lease in elsewhere or kept.get(lease, entry) != entry):
                    # one accepted group under two entry ids: counted once
                    verdict = SiteCheck(REFUSED, f"entry {entry} holds the group of lease {sealed[SEALED_LEASE]}, "
                                                 "reported failed already")
                seen.add(lease)
            seen.add(entry)
            out.counts[verdict.status] += 1
            mine = {k: v for k, v in item.items() if k not in SITE_KEYS}  # the site's word alone names a lease
            out.evidence.append({**mine, **sealed, **verdict.as_dict()})
            if verdict.status == REFUSED:
                log.warning("job %s step %s: FORGED audit report refused: worker %s entry %s: %s", self.job.pk,
                            step, worker_id, entry, verdict.why)
        out.counts[UNVERIFIED] += failed - len(failures)  # failures reported without evidence
        return out

    def _check_stored(self, item: dict[str, Any], fields: dict | None, *, worker_id: int,
                      keys: list[bytes]) -> tuple[SiteCheck, dict[str, str]]:
        """The verdict on one failure against the entry's stored ``fields`` (None: gone), believed only under the
        site's seal; with it, for a sealed entry, ``{SEALED_LEASE: its lease}`` (the lease is under the seal, the
        entry id is not: the same group copied under another entry id is the same failure), and for a text failure
        whose claimed text is the worker's ``{DECODE: PENDING}``: the site decodes it next, off this request."""
        if fields is None:
            return checks.check_failure(item, None, worker_id=worker_id, scorer=None, scorer_problem=""), {}
        entry = item["entry_id"]
        unsealed = checks.seal_verdict(fields, entry=entry, job_id=self.job.pk, keys=keys)
        if unsealed is not None:
            return unsealed, {}
        scorer, problem = self.scorer() if item.get("check") == "reward" else (None, "")
        verdict = checks.check_failure(item, stored_entry(entry, fields), worker_id=worker_id, scorer=scorer,
                                       scorer_problem=problem)
        decode = {DECODE: PENDING} if item.get("check") == "text" and verdict.status == checks.CONSISTENT else {}
        return verdict, {SEALED_LEASE: text(stored_field(fields, "lease_id")), **decode}


def _row_evidence(job: Job, worker_id: int, step: int) -> list[dict]:
    row = WorkerAudit.objects.filter(job=job, worker_id=worker_id, step=step).values_list("evidence", flat=True)
    return list(row[0]) if row else []


def _entries_reported(job: Job, worker_id: int, *, exclude_step: int) -> set[str | tuple[str, str]]:
    """The entries reported failed of the worker in the job's other steps, and their sealed leases (as
    ``(SEALED_LEASE, lease)``), except those refused."""
    out: set[str | tuple[str, str]] = set()
    for evidence in WorkerAudit.objects.filter(job=job, worker_id=worker_id, failed__gt=0).exclude(
            step=exclude_step).values_list("evidence", flat=True):
        for e in evidence:
            if not e.get("passed") and e.get("site") != REFUSED:
                out.add(e.get("entry_id"))
                if e.get(SEALED_LEASE):
                    out.add((SEALED_LEASE, e[SEALED_LEASE]))
    return out


def owners_needed() -> int:
    return max(0, int(settings.ECHO2.get("AUDIT_CORROBORATING_OWNERS", CORROBORATING_OWNERS)))


def worker_counted_failures(worker_id: int) -> tuple[int, dict[str, Any]]:
    """(the failures that count toward ``worker_id``'s suspension, over every job; the figures behind it)."""
    rows = WorkerAudit.objects.filter(worker_id=worker_id)
    sums = rows.aggregate(v=Sum("failed_verified"), c=Sum("failed_consistent"), u=Sum("failed_unverified"),
                          r=Sum("failed_refused"))
    owners = sorted(set(rows.filter(failed_consistent__gt=0).values_list("job__owner_id", flat=True)))
    needed = owners_needed()
    counted = checks.counted_failures(sums["v"] or 0, owners, owners_needed=needed)
    return counted, {"verified": sums["v"] or 0, "consistent": sums["c"] or 0, "consistent_owners": len(owners),
                     "owners_needed": needed, "unverified": sums["u"] or 0, "refused": sums["r"] or 0,
                     "counted": counted}


def standing_text(figures: dict[str, Any], *, limit: int) -> str:
    """Why a worker is (or is not) suspended, in one line for the provider."""
    parts = [f"{figures['counted']} of {limit} failures that count: {figures['verified']} verified by the site"]
    if figures["consistent"]:
        needed = figures["owners_needed"]
        corroborated = needed and figures["consistent_owners"] >= needed
        why = (f"needs {needed} distinct owners" if needed else
               "the site cannot verify them; each released the worker from that owner's job")
        parts.append(f"{figures['consistent']} log-prob/text failures from {figures['consistent_owners']} job "
                     f"owner(s) ({'counted once per owner' if corroborated else 'not counted'}: {why})")
    if figures["unverified"]:
        parts.append(f"{figures['unverified']} unverified (not counted)")
    if figures["refused"]:
        parts.append(f"{figures['refused']} refused as forged reports")
    return "; ".join(parts)


def audit_standing(worker: Worker) -> dict[str, Any]:
    """What the provider (and staff) see of a worker's audits: the failures that count, the limit, and in words
    why it is, or is not, suspended."""
    limit = int(settings.ECHO2["AUDIT_SUSPEND_AFTER"])
    _, figures = worker_counted_failures(worker.pk)
    text = standing_text(figures, limit=limit)
    if worker.suspended_at is not None:
        text = f"suspended: {worker.suspended_reason}" if figures["counted"] >= limit or not worker.suspended_reason \
            else f"suspended ({worker.suspended_reason}); its own audits: {text}"
    else:
        text = f"not suspended: {text}"
    return {**figures, "limit": limit, "suspended": worker.suspended_at is not None, "text": text}


def recent_failures(worker_ids: list[int], *, limit: int = 10) -> dict[int, list[dict[str, Any]]]:
    """Each worker's latest reported failures (newest first, at most ``limit``), each with its job, step, what the
    learner said failed and the site's verdict: what the provider portal lists under "Audits"."""
    out: dict[int, list[dict[str, Any]]] = {}
    rows = WorkerAudit.objects.filter(worker_id__in=worker_ids, failed__gt=0).order_by("-created_at", "-id")
    for row in rows[:limit * max(1, len(worker_ids))]:
        items = out.setdefault(row.worker_id, [])
        shown = [e for e in row.evidence if not e.get("passed")]
        for e in shown:
            items.append({"job": row.job_id, "step": row.step, "entry_id": e.get("entry_id", ""),
                          "check": e.get("check", ""), "site": e.get("site", checks.UNVERIFIED),
                          "site_reason": e.get("site_reason", "checked before the site checked failures")})
        if row.failed > len(shown):
            items.append({"job": row.job_id, "step": row.step, "entry_id": "", "check": "",
                          "site": checks.UNVERIFIED, "site_reason": f"{row.failed - len(shown)} failure(s) reported "
                          "without evidence"})
    return {w: items[:limit] for w, items in out.items()}
