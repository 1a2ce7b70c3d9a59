"""Reads over the ledger (docs/ledger.md): the entries a person may see, their totals, the rows of a statement or
an invoice (JSON or CSV), a worker's price history, and a job's spend against its budget.

Scoped like everything else (DESIGN.md "Invariants"): an owner sees the entries of its jobs, a provider those of its
workers, staff all. Amounts are exact decimals; a total is rounded to the cent once (``billing.cents``).
"""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime
from decimal import Decimal

from django.db.models import Count, Q, QuerySet, Sum
from django.db.models.functions import TruncDate

from ..core import billing, budget
from ..models import Activation, Job, JobMetric, LedgerEntry, Worker

COLUMNS = ("id", "at", "started_at", "job_id", "job_name", "worker_id", "worker_name", "state", "seconds",
           "rate_per_hour", "amount_usd")


def entries_visible_to(user) -> QuerySet[LedgerEntry]:
    """The entries ``user`` may read: of its jobs (as owner) and of its workers (as provider); staff: all."""
    if user.is_staff:
        return LedgerEntry.objects.all()
    return LedgerEntry.objects.filter(Q(owner=user) | Q(provider__user=user))


def entries(*, user, job: int | None = None, worker: int | None = None, since: datetime | None = None,
            until: datetime | None = None) -> QuerySet[LedgerEntry]:
    """The entries ``user`` may read, of one job and/or worker, billed in ``[since, until)`` (by ``at``)."""
    qs = entries_visible_to(user)
    if job is not None:
        qs = qs.filter(job_id=job)
    if worker is not None:
        qs = qs.filter(worker_id=worker)
    if since is not None:
        qs = qs.filter(at__gte=since)
    if until is not None:
        qs = qs.filter(at__lt=until)
    return qs.order_by("at", "id")


Position = tuple[datetime, int]
"""Where a page starts or ends in the ledger's order: an entry's ``(at, id)`` (unique, never changes)."""


def page(qs: QuerySet[LedgerEntry], *, limit: int, after: Position | None = None,
         before: Position | None = None) -> tuple[list[LedgerEntry], bool]:
    """Up to ``limit`` entries of ``qs`` in the ledger's order (``at``, then ``id``) strictly after ``after`` (or
    from the first), or else the last ``limit`` strictly before ``before``; and whether more lie beyond them in
    that direction. Keyset, not offset: an entry billed while a client walks the pages moves no other entry from
    one page to the next, and a deep page costs what the first does (the ``at`` index)."""
    if before is not None:
        at, pk = before
        rows = list(qs.filter(Q(at__lt=at) | Q(at=at, id__lt=pk)).order_by("-at", "-id")[:limit + 1])
        return rows[:limit][::-1], len(rows) > limit
    if after is not None:
        at, pk = after
        qs = qs.filter(Q(at__gt=at) | Q(at=at, id__gt=pk))
    rows = list(qs.order_by("at", "id")[:limit + 1])
    return rows[:limit], len(rows) > limit


def row(entry: LedgerEntry) -> dict:
    """One entry as the API, the CLI and the CSV show it (decimals as strings: exact)."""
    return {"id": entry.pk, "at": entry.at.isoformat(), "started_at": entry.started_at.isoformat(),
            "job_id": entry.job_id, "job_name": entry.job_name, "worker_id": entry.worker_id,
            "worker_name": entry.worker_name, "state": entry.state, "seconds": str(entry.seconds),
            "rate_per_hour": str(entry.rate), "amount_usd": str(entry.amount)}


def totals(qs: QuerySet[LedgerEntry]) -> dict:
    """The sum of ``qs``, exact and to the cent, and per rate (a price change shows as two rows); ``credited_usd``:
    what credits for failed work gave back (their entries are in the sum, negative: docs/ledger.md)."""
    whole = qs.aggregate(n=Count("id"), seconds=Sum("seconds"), amount=Sum("amount"))
    amount = whole["amount"] or Decimal(0)
    credited = -(qs.filter(state="credit").aggregate(amount=Sum("amount"))["amount"] or Decimal(0))
    by_rate = (qs.order_by().values("rate").annotate(seconds=Sum("seconds"), amount=Sum("amount"))
               .order_by("rate"))
    return {"entries": whole["n"], "seconds": str(whole["seconds"] or Decimal(0)), "amount_usd": str(amount),
            "total_usd": str(billing.cents(amount)), "credited_usd": str(credited),
            "by_rate": [{"rate_per_hour": str(r["rate"]), "seconds": str(r["seconds"]), "amount_usd": str(r["amount"])}
                        for r in by_rate],
            "by_job": _balances(qs, "job_id", "job_name"), "by_worker": _balances(qs, "worker_id", "worker_name"),
            "by_day": by_day(qs)}


def by_day(qs: QuerySet[LedgerEntry]) -> list[dict]:
    """Per UTC day billed (``at``), oldest first: an owner's spend or a provider's earnings over time."""
    rows = (qs.order_by().annotate(day=TruncDate("at", tzinfo=UTC)).values("day")
            .annotate(n=Count("id"), amount=Sum("amount"), seconds=Sum("seconds")).order_by("day"))
    return [{"day": r["day"].isoformat(), "entries": r["n"], "seconds": str(r["seconds"]),
             "amount_usd": str(r["amount"]), "total_usd": str(billing.cents(r["amount"]))} for r in rows]


def _balances(qs: QuerySet[LedgerEntry], key: str, name: str) -> list[dict]:
    """Per job (an owner's invoice lines) or per worker (a provider's statement lines): the sum, to the cent."""
    rows = qs.order_by().values(key, name).annotate(amount=Sum("amount"), seconds=Sum("seconds")).order_by(key)
    return [{"id": r[key], "name": r[name], "seconds": str(r["seconds"]), "amount_usd": str(r["amount"]),
             "total_usd": str(billing.cents(r["amount"]))} for r in rows]


_NAMED = ("job_name", "worker_name")  # what owners and providers type: the only free text of a row
_FORMULA = ("=", "+", "-", "@", "\t", "\r")


def _inert(text: str) -> str:
    """``text`` as a spreadsheet shows it, never runs it: a name like ``=HYPERLINK(...)`` in the other party's
    statement was a formula (CSV injection, OWASP); a leading apostrophe makes any such cell plain text."""
    return f"'{text}" if text.startswith(_FORMULA) else text


def as_csv(qs: QuerySet[LedgerEntry]) -> str:
    """The entries as CSV: one header line, one line per entry, and a last line whose total (to the cent) sits in a
    column of its own, ``total_usd``, so that a spreadsheet's sum of ``amount_usd`` is the total, not twice it."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=(*COLUMNS, "total_usd"), lineterminator="\n")
    writer.writeheader()
    for entry in qs.iterator():
        line = row(entry)
        for name in _NAMED:
            line[name] = _inert(line[name])
        writer.writerow(line)
    writer.writerow({"id": "total", "total_usd": totals(qs)["total_usd"]})
    return out.getvalue()


def price_history(worker: Worker) -> list[dict]:
    """The worker's prices, each from its date on, oldest first."""
    return [{"price_per_hour": str(p.price_per_hour), "from": p.at.isoformat()} for p in worker.prices.all()]


def job_spent_usd(job: Job) -> float:
    """What the job has cost so far: the sum of its ledger, kept per activation (``Activation.billed_usd``)."""
    return float(Activation.objects.filter(job=job).aggregate(s=Sum("billed_usd"))["s"] or 0)


def _step_seconds(job: Job) -> float:
    """The learner's last step, train and wait (its wall time between two reports), else its calibrated T_train."""
    last = JobMetric.objects.filter(job=job).order_by("-step").values("t_train", "wait_s").first()
    if last and last["t_train"] + last["wait_s"] > 0:
        return last["t_train"] + last["wait_s"]
    return job.learner_t_train or 0.0


def job_budget(job: Job) -> dict:
    """Spend, cost per step (with the pool active now: its prices times the last step's time; with no pool, e.g.
    paused, what a step has cost on average so far), and the forecast at the job's end (capped by its budget; a
    finished job's forecast is its spend)."""
    spent = job_spent_usd(job)
    prices = [float(p) for p in job.activations.filter(ended_at=None).values_list("price_per_hour", flat=True)]
    per_step = budget.cost_per_step(prices_per_hour=prices, step_s=_step_seconds(job)) or (
        spent / job.learner_step if job.learner_step else 0.0)
    spec = job.settings
    left = 0 if job.is_terminal else spec.max_steps - job.learner_step
    return {"spent_usd": spent, "cost_per_step_usd": per_step, "budget_usd": spec.budget_usd,
            "forecast_usd": budget.forecast(spent=spent, per_step=per_step, steps_left=left, budget=spec.budget_usd)}



def budget_problem(job: Job) -> str:
    """Why ``job`` may not run on ("": it may): its spend, or its spend plus the next step, passes its budget."""
    if job.settings.budget_usd is None:
        return ""
    figures = job_budget(job)
    return budget.over_budget(spent=figures["spent_usd"], per_step=figures["cost_per_step_usd"],
                              budget=job.settings.budget_usd)


def projected_cost_usd(job: Job, spent: float) -> float | None:
    """What the job will have cost at its end: a finished job its spend; a running one its forecast with the pool
    now (:func:`job_budget`), else its spend per step so far times its steps; None before its first step. Never
    more than its budget, where it pauses."""
    if job.is_terminal:
        return spent
    figures = job_budget(job)
    if figures["cost_per_step_usd"] > 0:
        return figures["forecast_usd"]
    if not job.learner_step:
        return None
    linear, cap = spent * job.settings.max_steps / job.learner_step, job.settings.budget_usd
    return min(linear, cap) if cap is not None else linear
