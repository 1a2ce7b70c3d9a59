"""Billed time of activations, from the states the site observes (the rules: ``marketplace.core.billing``).

``activation_observe`` turns what the site saw a worker do (``telemetry.observed``) into the state to bill;
``activation_report`` bills and records it.

Each report bills the interval since the previous one in the previous state, then records the new state. The
update is one ``UPDATE`` that adds with ``F()`` and only applies if no other report landed since the row was
read (compare-and-set on ``reported_at``), so two reports at once (an old socket and a new one, a heartbeat
and a release) neither lose time nor bill an interval twice. A billed interval is also a ledger entry
(``LedgerEntry``, docs/ledger.md), written in the same transaction as the sums it adds to, at the activation's
``price_per_hour`` then (a price change bills up to its date first: ``marketplace.services.controls``).

``activations_bill`` is the billing fold's: the same reports for many activations of one job, applied in memory to
their rows locked at once and written in a few statements, whatever their number (docs/ledger.md).
"""

from __future__ import annotations

import dataclasses
import logging
from datetime import UTC, datetime
from decimal import Decimal

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F

from ..core import billing, credits
from ..infra import telemetry
from ..models import Activation, Job, LedgerEntry, Worker

log = logging.getLogger(__name__)

CREDIT = "credit"  # a ledger entry's state for billed time given back (failed work is free)
ATTEMPTS = 8  # compare-and-set retries: each failure means another report just landed, so this is plenty
_ROW = ("state", "state_reason", "reported_at", "price_per_hour", "job_id", "worker_id", "worker__name",
        "worker__provider_id", "job__name", "job__owner_id")


def gap_limit_s() -> float:
    """The longest interval between two reports that is billed: the worker timeout (past it the site would have
    released the worker; it does not know what the worker did meanwhile)."""
    return float(settings.ECHO2["WORKER_TIMEOUT_S"])


def activation_observe(*, activation: Activation, at: datetime, reported: str = "idle", reason: str = "",
                       seen: telemetry.Observed | None = None, connected: bool = True) -> Activation | None:
    """Bill ``activation`` up to ``at`` by what the site observed (``billing.observed_reports``; ``seen``: read now
    when not given) and record that state. ``reported``: the state the agent claims for this job, which counts only
    when it is ``failed``; ``connected``: whether its agent's socket is open. Returns the updated activation, None
    when it has ended."""
    if seen is None:
        seen = telemetry.observed([activation.worker_id], job_id=activation.job_id)[activation.worker_id]
    row = Activation.objects.filter(pk=activation.pk, ended_at=None).values("reported_at", "state").first()
    if row is None:
        return None
    reports = billing.observed_reports(
        state=row["state"], reported_at=row["reported_at"].timestamp(), started=activation.started_at.timestamp(),
        reported=reported, installed=seen.installed, held_since=seen.held_since, held_until=seen.held_until,
        holds=seen.holds, now=at.timestamp(), connected=connected)
    updated = None
    for when, state in reports:  # one compare-and-set each: a report that lands between them is not billed twice
        updated = activation_report(activation_id=activation.pk, at=at if when == at.timestamp() else _utc(when),
                                    state=state, reason=reason if state == "failed" else "")
    return updated


def activation_report(*, activation_id: int, at: datetime, state: str | None = None,
                      reason: str = "") -> Activation | None:
    """Bill ``activation_id``'s time up to ``at`` in the state it was in, then (unless ``state`` is None: only
    bring the bill up to ``at``) record that it is in ``state`` from ``at``. Returns the updated activation,
    None when it has ended. A report older than the last one changes nothing but the state, except that one saying
    the worker stopped working (a state not billed) gives back what was billed after it (``failed_work_credit``)."""
    for _ in range(ATTEMPTS):
        row = Activation.objects.filter(pk=activation_id, ended_at=None).values(*_ROW).first()
        if row is None:
            return None
        last = row["reported_at"]
        seconds = billing.billable_seconds(state=row["state"], since=last.timestamp(), until=at.timestamp(),
                                           gap_limit_s=gap_limit_s())
        exact, amount = billing.interval_amount(seconds=seconds, rate=row["price_per_hour"])
        new_state = row["state"] if state is None else state
        fields: dict = {"billed_seconds": F("billed_seconds") + seconds, "billed_usd": F("billed_usd") + amount,
                        "reported_at": max(at, last), "state": new_state,
                        "state_reason": row["state_reason"] if state is None else reason}
        if new_state != row["state"]:
            fields["state_since"] = max(at, last)
        with transaction.atomic():
            if not Activation.objects.filter(pk=activation_id, ended_at=None, reported_at=last).update(**fields):
                continue
            if exact > 0:
                _ledger_write(row, activation_id=activation_id, since=last, at=at, seconds=exact, amount=amount)
        if at < last and state is not None and state not in billing.BILLABLE_STATES:
            # the site learned late that the worker stopped at ``at`` (its last heartbeat, found silent): what was
            # billed after it, a frozen agent's lease until its timeout, is given back
            failed_work_credit(job_id=row["job_id"], worker_id=row["worker_id"],
                               windows=[(at.timestamp(), last.timestamp())], now=datetime.now(tz=UTC))
        return Activation.objects.get(pk=activation_id)
    log.warning("activation %s: state report at %s lost to %d concurrent reports", activation_id, at, ATTEMPTS)
    return None


@dataclasses.dataclass(frozen=True)
class Observation:
    """What the billing fold bills one open activation by (``activations_bill``)."""

    activation_id: int
    worker_id: int
    seen: telemetry.Observed
    reported: str = "idle"  # the state its agent claims that counts: ``failed``, else idle
    reason: str = ""  # why it failed, when it did
    connected: bool = True  # its agent's socket is open
    throughput: float | None = None  # its ``mu_i`` as the site measured it now, for its worker's row (None: unchanged)


@dataclasses.dataclass(frozen=True)
class Bill:
    """An activation as the billing fold left it."""

    state: str
    state_since: datetime
    state_reason: str
    reported_at: datetime
    billed_seconds: float
    billed_usd: Decimal


def activations_bill(*, job_id: int, observations: list[Observation], at: datetime) -> dict[int, Bill]:
    """Bill the open activations of ``job_id`` named in ``observations`` up to ``at``, each by what the site
    observed it do (``billing.observed_reports``, the reports ``activation_observe`` makes one at a time, applied
    with ``billing.fold_reports``: the same seconds and amounts to the last digit), in one transaction of a fixed
    number of statements whatever their number: the job's row share-locked, the workers' rows and then the
    activations' locked in id order, one read of the activations, one ``UPDATE`` of them all, one ``INSERT`` of
    their ledger entries and one ``UPDATE`` of the workers' measured throughput. Returns each billed activation's
    new figures by id.

    Locks: the job's row first, ``FOR KEY SHARE`` (what its ledger entries' key needs), holding nothing yet: the
    site's transactions lock a job's row ``FOR NO KEY UPDATE`` (a finish, a pause, a learner's report, a re-plan),
    which it does not wait for, so it waits only for the job's deletion; past that row it never waits. A worker's
    or an activation's row that another transaction holds now (a release, a price change, a heartbeat's own
    report) is left out: that one bills it, or the next fold does. The compare-and-set of
    ``activation_report`` is the row lock here: every report bills from the last one's time to its own, so a report
    that lands before or after the fold, or a fold run twice, bills no interval twice and loses none."""
    wanted = {o.activation_id: o for o in observations}
    if not wanted:
        return {}
    gap = gap_limit_s()
    bills: dict[int, Bill] = {}
    with transaction.atomic():
        if not _share_job(job_id):
            return {}
        workers = set(Worker.objects.select_for_update(no_key=True, skip_locked=True)
                      .filter(pk__in=sorted({o.worker_id for o in observations})).order_by("pk")
                      .values_list("pk", flat=True))
        rows = list(Activation.objects.select_for_update(no_key=True, skip_locked=True, of=("self",))
                    .filter(pk__in=[pk for pk, o in wanted.items() if o.worker_id in workers], job_id=job_id,
                            ended_at=None)
                    .order_by("pk").values("pk", "started_at", "state_since", "billed_seconds", "billed_usd", *_ROW))
        changed, entries, measured = [], [], []
        for row in rows:
            seen = wanted[row["pk"]]
            if row["reported_at"] >= at:  # a report at or after this fold's time billed it already
                continue
            bills[row["pk"]], billed = _bill_row(row, seen=seen, at=at, gap_limit_s=gap)
            changed.append(Activation(pk=row["pk"], **dataclasses.asdict(bills[row["pk"]])))
            entries += billed
            if seen.throughput is not None:
                measured.append(Worker(pk=row["worker_id"], throughput=seen.throughput))
        Activation.objects.bulk_update(changed, [f.name for f in dataclasses.fields(Bill)])
        LedgerEntry.objects.bulk_create(entries)
        Worker.objects.bulk_update(measured, ["throughput"])
    return bills


def _bill_row(row: dict, *, seen: Observation, at: datetime, gap_limit_s: float) -> tuple[Bill, list[LedgerEntry]]:
    """One activation's bill up to ``at`` (``row``: as ``activations_bill`` read it, locked) and its ledger entries,
    unsaved."""
    now, last = at.timestamp(), row["reported_at"].timestamp()
    reports = billing.observed_reports(
        state=row["state"], reported_at=last, started=row["started_at"].timestamp(), reported=seen.reported,
        installed=seen.seen.installed, held_since=seen.seen.held_since, held_until=seen.seen.held_until,
        holds=seen.seen.holds, now=now, connected=seen.connected)
    # at the database's resolution (the microsecond), as each report one at a time is stored and read back
    reports = [(_utc(when).timestamp(), state) for when, state in reports]
    folded = billing.fold_reports(state=row["state"], reported_at=last, rate=row["price_per_hour"], reports=reports,
                                  gap_limit_s=gap_limit_s)
    seconds = row["billed_seconds"]
    for added in folded.added_seconds:  # in the order the database adds them, report by report
        seconds += added

    def when(t: float) -> datetime:  # the fold's own time as given, every other as a UTC time
        return at if t == now else _utc(t)

    bill = Bill(state=folded.state, reported_at=when(folded.reported_at),
                state_since=row["state_since"] if folded.state_since is None else when(folded.state_since),
                state_reason=seen.reason if folded.state == "failed" else "", billed_seconds=seconds,
                billed_usd=row["billed_usd"] + folded.amount)
    return bill, [LedgerEntry(
        activation_id=row["pk"], job_id=row["job_id"], worker_id=row["worker_id"],
        provider_id=row["worker__provider_id"], owner_id=row["job__owner_id"], worker_name=row["worker__name"],
        job_name=row["job__name"], state=i.state, started_at=_utc(i.start), at=when(i.end), seconds=i.seconds,
        rate=row["price_per_hour"], amount=i.amount) for i in folded.intervals]


def _share_job(job_id: int) -> bool:
    """Lock job ``job_id``'s row ``FOR KEY SHARE`` (the lock its ledger entries' foreign key takes anyway): it stays
    while this transaction runs; False when it is gone. Where the database has no row locks
    (SQLite, local development), only whether it exists."""
    if not connection.features.has_select_for_update:
        return Job.objects.filter(pk=job_id).exists()
    with connection.cursor() as cursor:
        cursor.execute(f'SELECT 1 FROM "{Job._meta.db_table}" WHERE "id" = %s FOR KEY SHARE', [job_id])
        return cursor.fetchone() is not None


def _ledger_write(row: dict, *, activation_id: int, since: datetime, at: datetime, seconds, amount) -> None:
    """The ledger entry of one billed interval (``row``: the activation as :func:`activation_report` read it)."""
    LedgerEntry.objects.create(
        activation_id=activation_id, job_id=row["job_id"], worker_id=row["worker_id"],
        provider_id=row["worker__provider_id"], owner_id=row["job__owner_id"], worker_name=row["worker__name"],
        job_name=row["job__name"], state=row["state"], started_at=since, at=at, seconds=seconds,
        rate=row["price_per_hour"], amount=amount)


def failed_work_credit(*, job_id: int, worker_id: int, windows: list[tuple[float, float]],
                       now: datetime) -> list[LedgerEntry]:
    """Give the owner back the billed generating time of ``worker_id`` in ``job_id`` inside ``windows`` (the spans
    its failed groups were generated in: ``marketplace.core.credits``), each second once over every call: one
    ``credit`` entry per billed interval and stretch of window, ``seconds`` and ``amount`` negative, and each
    activation's running sums lowered in the same transaction, so the ledger and the pages still agree to the
    cent (docs/ledger.md "Credits for failed work"). The credit is dated ``now`` (it lands after every entry a
    statement already read) and starts where the time it gives back started."""
    if not windows:
        return []
    made: list[LedgerEntry] = []
    first, last = min(w[0] for w in windows), max(w[1] for w in windows)
    for activation_id in Activation.objects.filter(job_id=job_id, worker_id=worker_id).values_list("pk", flat=True):
        with transaction.atomic():
            row = Activation.objects.select_for_update(no_key=True).filter(pk=activation_id).values(*_ROW).first()
            entries = LedgerEntry.objects.filter(activation_id=activation_id)
            billed = [credits.Billed(start=e.started_at.timestamp(), end=e.at.timestamp(), rate=e.rate)
                      for e in entries.filter(state="generating", at__gt=_utc(first), started_at__lt=_utc(last))]
            given = [(e.started_at.timestamp(), e.started_at.timestamp() + float(-e.seconds))
                     for e in entries.filter(state=CREDIT)]
            due = [c for c in credits.credits(windows=windows, billed=billed, credited=given)
                   if c.end - c.start >= credits.MIN_CREDIT_S]
            if not due:
                continue
            for credit in due:
                made.append(LedgerEntry.objects.create(
                    activation_id=activation_id, job_id=row["job_id"], worker_id=row["worker_id"],
                    provider_id=row["worker__provider_id"], owner_id=row["job__owner_id"],
                    worker_name=row["worker__name"], job_name=row["job__name"], state=CREDIT,
                    started_at=_utc(credit.start), at=now, seconds=credit.seconds, rate=credit.rate,
                    amount=credit.amount))
            Activation.objects.filter(pk=activation_id).update(
                billed_seconds=F("billed_seconds") + float(sum(c.seconds for c in due)),
                billed_usd=F("billed_usd") + sum(c.amount for c in due))
        log.info("job %s: worker %s's failed work credited to the owner: %d interval(s), %s s, %s USD", job_id,
                 worker_id, len(due), sum(c.seconds for c in due), sum(c.amount for c in due))
    return made


def _utc(at: float) -> datetime:
    return datetime.fromtimestamp(at, tz=UTC)
