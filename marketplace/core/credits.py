"""Failed work is free (docs/ledger.md "Credits for failed work"): which billed time a failed audit gives back.

A group that fails its audit was generated while the worker's activation was billed ``generating``: between its
lease and the moment the site accepted it. The site knows both ends from what it stored under its seal and the
stream: the lease id is the prompt's stream entry id (when the site added the prompt: the lease came at or after
it), the group's own entry id is when the site accepted it, and no lease is outstanding longer than the lease
timeout (past it the prompt goes to another worker). So the group was generated within ``[max(prompt added,
accepted - lease timeout), accepted]``: its *window*. The credit gives back the billed ``generating`` time of that
activation inside the union of the failed groups' windows, at the rate each billed interval was billed at, each
second at most once over every report (time already credited is not credited again).

Plain functions over Unix times and decimals: no Django.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal

from .billing import interval_amount

MIN_CREDIT_S = 1e-3  # shorter stretches are the microsecond rounding of spans credited before, not time to give back

@dataclass(frozen=True)
class Billed:
    """One billed interval of the activation (a ledger entry): ``[start, end]`` at ``rate`` USD/h."""

    start: float
    end: float
    rate: Decimal


@dataclass(frozen=True)
class Credit:
    """Billed time given back: ``[start, end]`` at ``rate``; ``seconds`` and ``amount`` negative, as the ledger
    stores them (an entry's amount is its own seconds x rate / 3600)."""

    start: float
    end: float
    rate: Decimal
    seconds: Decimal
    amount: Decimal


def entry_time(entry_id: str) -> float | None:
    """The Unix time a stream entry id names (its milliseconds part); None for a malformed one."""
    ms, _, _ = entry_id.partition("-")
    return int(ms) / 1000 if ms.isdigit() else None


def failure_window(*, entry_id: str, lease_id: str, lease_timeout_s: float) -> tuple[float, float] | None:
    """The window a failed group was generated in: from its prompt's entry (or the lease timeout before its
    acceptance, whichever is later) to its acceptance; None when either id is malformed or out of order."""
    accepted, added = entry_time(entry_id), entry_time(lease_id)
    if accepted is None or added is None or added > accepted:
        return None
    return max(added, accepted - lease_timeout_s), accepted


def union(spans: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The spans merged where they overlap or touch, in order."""
    out: list[list[float]] = []
    for start, end in sorted(s for s in spans if s[1] > s[0]):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def _minus(spans: list[tuple[float, float]], taken: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out = []
    for start, end in spans:
        pieces = [(start, end)]
        for a, b in taken:
            pieces = [p for s, e in pieces for p in ((s, min(e, a)), (max(s, b), e)) if p[1] > p[0]]
        out.extend(pieces)
    return out


def credits(*, windows: Iterable[tuple[float, float]], billed: Iterable[Billed],
            credited: Iterable[tuple[float, float]]) -> list[Credit]:
    """The credits that give back the ``billed`` generating time inside ``windows``, less the spans ``credited``
    before: one per billed interval and stretch of window, in time order."""
    todo = _minus(union(windows), union(credited))
    out = []
    for interval in sorted(billed, key=lambda b: b.start):
        for start, end in todo:
            a, b = max(start, interval.start), min(end, interval.end)
            if b <= a:
                continue
            seconds, amount = interval_amount(seconds=b - a, rate=interval.rate)
            if seconds > 0:
                out.append(Credit(start=a, end=b, rate=interval.rate, seconds=-seconds, amount=-amount))
    return out
