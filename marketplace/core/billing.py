"""Billing only useful work: which of an activation's time is paid for (docs/faults.md, "Billing only useful work").

The state billed is the one the site observes (:func:`observed_state`: leases taken, groups accepted, installs of
published versions; docs/trust.md, "What the scheduler believes"), never the one a heartbeat claims
(``WorkerState``, shown as "reported"). A state holds from the report that recorded it until the next; the site
bills the interval between two reports when the earlier one was ``installing`` or ``generating``. The paper's cost
model pays a worker while it serves the job (section 3.4); we narrow "serves" to installing snapshots and
generating rollouts, so ``loading`` (building the engine from the job's base, version 0, which happens once per
activation), ``idle`` (waiting for work or a version) and ``failed`` (a crashed rollout loop, being restarted) are
free; and "generating" is what the site saw (leases, accepted groups), so silent time is free too; it is now
a lease outstanding on an open socket, from the lease to its group's acceptance or its timeout (not a
fixed hold after the last lease, which billed killed agents and stalled jobs for up to the lease timeout). An
interval longer than the worker timeout is not billed at all: the site does not know what the worker did meanwhile.

Plain functions over plain values; the database side is ``services.billing``.
"""

from __future__ import annotations

import dataclasses
from decimal import ROUND_HALF_UP, Decimal

from dataplane.messages import BILLED_STATES as BILLABLE_STATES


def billable_seconds(*, state: str, since: float, until: float, gap_limit_s: float) -> float:
    """Seconds of ``[since, until]`` (Unix times) to bill, the worker having reported ``state`` at ``since`` and
    nothing since: all of it in a billable state, nothing otherwise, nothing for a gap beyond ``gap_limit_s``
    (nor for a report older than the previous one: time never runs backwards on the bill)."""
    span = until - since
    if state not in BILLABLE_STATES or span <= 0 or span > gap_limit_s:
        return 0.0
    return span


def effective_state(*, reported: str, reported_job_id: int | None, job_id: int) -> str:
    """The state the activation of ``job_id`` is in, from a heartbeat about ``reported_job_id``: an agent that
    has not yet taken the assignment (or still speaks of another job) is not working for this job: ``idle``."""
    return reported if reported_job_id == job_id else "idle"


def observed_state(*, reported: str, started: float, installed: float | None, held_since: float | None,
                   held_until: float | None, now: float, connected: bool = True) -> tuple[str, float]:
    """The state an activation started at ``started`` is in at ``now`` as the site saw it, and the time from which
    it holds (earlier than ``now`` when it began after the last report could say so: the caller bills up to it).

    Bills follow leases, not recency: generating is a lease outstanding with the socket open. ``held_since``: when
    the leases the worker holds now began to be held (None: it holds none); ``held_until``: when the last lease it
    held stopped being held (its group accepted, or its timeout ran out unanswered).

    - ``failed``: the agent says its rollout loop crashed; believed, since the word only lowers its own bill;
    - ``loading``: no install of a published version of the job reported (``installed``) since the activation
      started: building the engine from the base, free (not serving yet); a worker that never installs is never
      billed;
    - ``idle`` with the socket closed (``connected`` False), from ``now``: its leases went back with the socket and
      nothing it does can be delivered; no later observation turns it back;
    - ``generating`` from ``held_since`` while a lease is outstanding;
    - ``idle`` otherwise, from ``held_until``: the time after its last lease, waiting for work that does not come
      (no prompts: the learner gone) or not asking, is not billed, whatever the heartbeat says.
    """
    if reported == "failed":
        return "failed", now
    if installed is None or installed < started:
        return "loading", now
    if not connected:
        return "idle", now
    if held_since is not None:
        return "generating", min(max(held_since, started), now)
    if held_until is None or held_until < started:
        return "idle", now
    return "idle", min(held_until, now)


# Leases closer than this are one span: Redis dates deliveries and idle times to the millisecond, so a group
# returned and the next lease taken in the same script can read a millisecond apart. A real wait between two
# leases (the next asked for in another round trip) is longer, and free.
HOLD_GAP_S = 0.002


def held_spans(*, holds: list[tuple[float, float]] | tuple, held_since: float | None, since: float,
               until: float) -> list[tuple[float, float]]:
    """The spans of ``(since, until]`` in which the worker held at least one lease: the union of ``holds`` (each
    ended lease's start and end) and, while it holds one now, ``held_since`` to ``until``; spans closer than
    :data:`HOLD_GAP_S` merged. Bills follow these, not the state seen at the two reports around them: a worker that
    returned a group, waited for work (none came: the learner was behind) and leased again between two heartbeats
    held no lease meanwhile, and is not billed for the wait."""
    spans = [(max(a, since), min(b, until)) for a, b in holds]
    if held_since is not None:
        spans.append((max(held_since, since), until))
    out: list[tuple[float, float]] = []
    for start, end in sorted(s for s in spans if s[1] > s[0]):
        if out and start <= out[-1][1] + HOLD_GAP_S:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def observed_reports(*, state: str, reported_at: float, started: float, reported: str, installed: float | None,
                     held_since: float | None, held_until: float | None, holds: list[tuple[float, float]] | tuple,
                     now: float, connected: bool = True) -> list[tuple[float, str]]:
    """The state reports, ``(at, state)`` in order, that bring an activation billed up to ``reported_at`` in
    ``state`` up to ``now`` by what the site observed (:func:`observed_state`; the arguments are its own, and
    ``holds`` those of :func:`held_spans`). While the socket is open and the observed state is generating or idle,
    the bill follows each lease: generating from a span's start, idle from its end, so the time between two leases
    of one interval is not billed (the state at ``reported_at`` is first set to what the leases say: a state billed
    nothing, loading or failed, reads as idle). Otherwise the observed state from when it began. The last report is
    at ``now``. Each report bills the interval before it in the state before it (:func:`fold_reports`)."""
    seen, since = observed_state(reported=reported, started=started, installed=installed, held_since=held_since,
                                 held_until=held_until, now=now, connected=connected)
    reports: list[tuple[float, str]] = []
    if seen in ("generating", "idle") and connected:
        spans = held_spans(holds=holds, held_since=held_since, since=reported_at, until=now)
        holding = bool(spans) and spans[0][0] <= reported_at
        if (state == "generating") != holding:
            reports.append((reported_at, "generating" if holding else "idle"))
        for start, end in spans:
            if start > reported_at:
                reports.append((start, "generating"))
            if end < now:
                reports.append((end, "idle"))
    elif since < now:
        reports.append((since, seen))
    reports.append((now, seen))
    return reports


@dataclasses.dataclass(frozen=True)
class Interval:
    """One billed interval, as a ledger entry holds it: ``seconds`` (to the microsecond) in ``state`` from
    ``start`` to ``end`` (Unix times), worth ``amount`` USD."""

    state: str
    start: float
    end: float
    seconds: Decimal
    amount: Decimal


@dataclasses.dataclass(frozen=True)
class Folded:
    """An activation after a sequence of state reports (:func:`fold_reports`)."""

    state: str
    state_since: float | None  # when the last change of state took effect; None: the state did not change
    reported_at: float
    added_seconds: tuple[float, ...]  # each report's billed seconds, in order (summed in that order, as the
    # database sums them one report at a time)
    intervals: tuple[Interval, ...]

    @property
    def amount(self) -> Decimal:
        return sum((i.amount for i in self.intervals), Decimal(0))


def fold_reports(*, state: str, reported_at: float, rate: Decimal, reports: list[tuple[float, str]],
                 gap_limit_s: float) -> Folded:
    """What the reports ``(at, state)`` do, one after the other, to an activation billed up to ``reported_at`` in
    ``state`` at ``rate`` USD/h: each bills the interval since the previous one in the state before it
    (:func:`billable_seconds`, :func:`interval_amount`), then records its own state from its time; a report older
    than the previous one bills nothing and moves no clock back. The same arithmetic as the service's report at a
    time (``services.billing.activation_report``), so that a batch of activations billed at once is billed to the
    microsecond as it would have been report by report."""
    since: float | None = None
    added: list[float] = []
    intervals: list[Interval] = []
    for at, new in reports:
        seconds = billable_seconds(state=state, since=reported_at, until=at, gap_limit_s=gap_limit_s)
        exact, amount = interval_amount(seconds=seconds, rate=rate)
        added.append(seconds)
        if exact > 0:
            intervals.append(Interval(state=state, start=reported_at, end=at, seconds=exact, amount=amount))
        if new != state:
            since = max(at, reported_at)
        state, reported_at = new, max(at, reported_at)
    return Folded(state=state, state_since=since, reported_at=reported_at, added_seconds=tuple(added),
                  intervals=tuple(intervals))


def silence_bound_s(*, min_s: float, groups: float, group_size: int, throughput: float | None) -> float:
    """How long an installed worker may hold an activation without a group accepted: ``groups`` expected group times
    (``group_size / mu_i``, with the site's measured ``mu_i``), never under ``min_s`` (all there is until measured)."""
    if not throughput:
        return min_s
    return max(min_s, groups * group_size / throughput)


def silent_reason(*, started: float, installed: float | None, accepted: float | None, now: float, bound_s: float,
                  loading_bound_s: float, starved: float | None = None) -> str:
    """Why an activation that returned nothing ends now ("": it does not): no install reported ``loading_bound_s``
    after it started, or no group accepted for ``bound_s`` since its install, its last accepted group or the last
    time it asked for work and the job had none (``starved``: an empty pool is not the worker's silence). Leases
    taken do not count: a worker that leases and never returns returns nothing."""
    if installed is None or installed < started:
        if now - started > loading_bound_s:
            return f"silent: no install reported in {loading_bound_s:.0f} s"
        return ""
    last = max(t for t in (started, installed, accepted, starved) if t is not None)
    if now - last > bound_s:
        return f"silent: no group accepted for {bound_s:.0f} s"
    return ""


def failing_too_long(*, state: str, since: float, now: float, limit_s: float) -> bool:
    """Whether an activation has been ``failed`` (its rollout loop crashing, restarted, crashing again) since
    ``since`` for ``limit_s`` or longer: then the site releases the worker so the scheduler can pick another."""
    return state == "failed" and now - since >= limit_s


def cost_usd(*, price_per_hour: float, billed_seconds: float) -> float:
    """USD for ``billed_seconds`` at ``price_per_hour`` (``c_i``), as a float: for forecasts, never for the bill."""
    return price_per_hour * max(0.0, billed_seconds) / 3600.0


MICROSECOND = Decimal("0.000001")
NANO_USD = Decimal("0.000000001")  # a ledger amount's last place (marketplace/models/ledger.py AMOUNT_PLACES)
CENT = Decimal("0.01")


def interval_amount(*, seconds: float, rate: Decimal) -> tuple[Decimal, Decimal]:
    """``(seconds, amount)`` of one billed interval as the ledger stores them: the seconds to the microsecond, the
    amount (``seconds x rate / 3600``, rate in USD/h) to 1e-9 USD, from the rounded seconds so that an entry's
    amount is what its own columns say."""
    exact = Decimal(repr(max(0.0, seconds))).quantize(MICROSECOND, rounding=ROUND_HALF_UP)
    return exact, (exact * Decimal(rate) / 3600).quantize(NANO_USD, rounding=ROUND_HALF_UP)


def cents(amount: Decimal | float | int) -> Decimal:
    """A total to the cent (half up), as statements, invoices and pages show it."""
    return Decimal(str(amount)).quantize(CENT, rounding=ROUND_HALF_UP)
