"""Bills against leases in the fault suite (bench/bench_faults.py): what the site billed each worker against the
seconds it held a lease, both read from the site's own records.

- Leases: the job's prompt stream in the run's private Redis (``dataplane.replay``: a lease is an entry pending
  under the worker's consumer, delivered at ``now - idle``). :class:`LeaseWatch` reads every pending entry every
  ``period`` seconds; a lease is held from its delivery until its entry leaves the consumer (group accepted, handed
  back, claimed by another) or its lease timeout runs out, whichever is first. Its end is known to half a period.
- Sockets: the site's ``WorkerSession`` rows (opened at the welcome, closed when the site saw the socket go).
- Bills: the site's ``LedgerEntry`` rows of the job in state ``generating`` (each an interval ``[started_at, at]``),
  less its ``credit`` rows (billed time given back: ``[started_at, started_at - seconds]``).

The rule the bill should follow (``marketplace.core.billing.observed_state``): generating = a lease outstanding and
the socket open. So "held" is the lease intervals clipped to the worker's open sessions, and the row shows billed,
held, billed but not held (over) and held but not billed (under), worker-seconds summed over workers.
"""

from __future__ import annotations

import bisect
import sqlite3
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

Interval = tuple[float, float]


def union(intervals: list[Interval]) -> list[Interval]:
    """Sorted, disjoint intervals covering ``intervals`` (empty ones dropped)."""
    out: list[Interval] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def intersect(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """The parts of ``a`` inside ``b`` (both unions)."""
    out, j = [], 0
    for start, end in a:
        while j < len(b) and b[j][1] <= start:
            j += 1
        k = j
        while k < len(b) and b[k][0] < end:
            lo, hi = max(start, b[k][0]), min(end, b[k][1])
            if hi > lo:
                out.append((lo, hi))
            k += 1
    return out


def minus(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """The parts of ``a`` outside ``b`` (both unions)."""
    out = []
    for start, end in a:
        cut = start
        for lo, hi in b:
            if hi <= cut or lo >= end:
                continue
            if lo > cut:
                out.append((cut, lo))
            cut = max(cut, hi)
        if cut < end:
            out.append((cut, end))
    return out


def total(intervals: list[Interval]) -> float:
    return sum(end - start for start, end in intervals)


@dataclass
class Lease:
    worker: str  # the consumer name (``worker-<id>``)
    start: float  # delivery, Unix time
    last_seen: float


@dataclass
class LeaseWatch:
    """Every ``period`` seconds, every entry pending in ``key``'s consumer group ``group`` (``redis``: a client of the
    run's private Redis), kept as :class:`Lease`. Runs on a thread of its own until :meth:`stop`; a sample that
    fails (Redis down) is skipped: a lease seen before and after the gap was held through it."""

    redis: object
    key: str
    group: str
    period: float = 0.1
    leases: dict[tuple[str, str, int], Lease] = field(default_factory=dict)
    samples: list[float] = field(default_factory=list)
    failed: int = 0

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="lease-watch", daemon=True)

    def start(self) -> LeaseWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.sample()
            except Exception:  # noqa: BLE001 - Redis restarting, the stream not there yet: the next sample counts
                self.failed += 1

    def sample(self) -> None:
        # Redis' own clock, read in the same transaction as the idle times: the bench's clock read after the reply
        # came would date every delivery late by the reply's delay (tens of ms on a loaded machine, every lease)
        pipe = self.redis.pipeline(transaction=True)
        pipe.time()
        pipe.xpending_range(self.key, self.group, min="-", max="+", count=100_000)
        (seconds, micros), pending = pipe.execute()
        now = seconds + micros / 1e6
        for p in pending:
            consumer = p["consumer"].decode() if isinstance(p["consumer"], bytes) else p["consumer"]
            entry = p["message_id"].decode() if isinstance(p["message_id"], bytes) else p["message_id"]
            key = (entry, consumer, int(p["times_delivered"]))
            lease = self.leases.get(key)
            if lease is None:
                self.leases[key] = Lease(consumer, now - p["time_since_delivered"] / 1000, now)
            else:
                lease.last_seen = now
        self.samples.append(now)

    def held(self, timeout_s: float) -> dict[str, list[Interval]]:
        """Per consumer, the union of its leases: each from its delivery to the middle of its last sample and the
        next (it was gone then), at most ``timeout_s`` (then it is no longer held: it may go to anyone)."""
        per: dict[str, list[Interval]] = {}
        for lease in self.leases.values():
            i = bisect.bisect_right(self.samples, lease.last_seen)
            end = (lease.last_seen + self.samples[i]) / 2 if i < len(self.samples) else lease.last_seen
            per.setdefault(lease.worker, []).append((lease.start, min(end, lease.start + timeout_s)))
        return {w: union(v) for w, v in per.items()}


def _unix(text: str | None) -> float | None:
    """A Django DateTimeField as SQLite stores it (UTC text) in Unix seconds."""
    if text is None:
        return None
    at = datetime.fromisoformat(text)
    return (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()


def site_records(db: Path, job_id: int, until: float) -> tuple[dict[int, list[Interval]], dict[int, list[Interval]]]:
    """(billed generating intervals, open socket intervals) per worker id, from the run's SQLite database; a
    session still open counts as open until ``until``."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        billed: dict[int, list[Interval]] = {}
        for worker, start, end in con.execute("SELECT worker_id, started_at, at FROM marketplace_ledgerentry "
                                              "WHERE job_id = ? AND state = 'generating'", (job_id,)):
            billed.setdefault(worker, []).append((_unix(start), _unix(end)))
        given: dict[int, list[Interval]] = {}  # credits: billed time given back, from its start (seconds < 0)
        for worker, start, seconds in con.execute("SELECT worker_id, started_at, seconds FROM "
                                                  "marketplace_ledgerentry WHERE job_id = ? AND state = 'credit'",
                                                  (job_id,)):
            given.setdefault(worker, []).append((_unix(start), _unix(start) - float(seconds)))
        sessions: dict[int, list[Interval]] = {}
        for worker, start, end in con.execute("SELECT worker_id, started_at, ended_at FROM "
                                              "marketplace_workersession"):
            sessions.setdefault(worker, []).append((_unix(start), _unix(end) or until))
    finally:
        con.close()
    billed = {w: minus(union(v), union(given.get(w, []))) for w, v in billed.items()}
    return billed, {w: union(v) for w, v in sessions.items()}


def reconcile(*, billed: dict[int, list[Interval]], held: dict[int, list[Interval]],
              sessions: dict[int, list[Interval]], stalled: list[Interval], until: float) -> dict:
    """Worker-seconds of the row, summed over workers: ``billed`` (generating, the ledger), ``held`` (a lease
    outstanding with the socket open), ``over`` (billed, not held), ``under`` (held, not billed),
    ``billed_closed`` (billed with the worker's socket closed), ``billed_stalled`` / ``held_stalled`` (inside
    ``stalled``: the spans the job could not progress), and per worker the difference billed - held."""
    out = {"billed": 0.0, "held": 0.0, "over": 0.0, "under": 0.0, "billed_closed": 0.0, "billed_stalled": 0.0,
           "held_stalled": 0.0, "per_worker": {}}
    stalled = union(stalled)
    for wid in sorted(set(billed) | set(held)):
        bill, open_ = billed.get(wid, []), sessions.get(wid, [])
        lease = intersect(held.get(wid, []), open_)
        closed = minus([(min(i[0] for i in bill), until)], open_) if bill else []
        figures = {"billed": total(bill), "held": total(lease), "over": total(minus(bill, lease)),
                   "under": total(minus(lease, bill)), "billed_closed": total(intersect(bill, closed)),
                   "billed_stalled": total(intersect(bill, stalled)),
                   "held_stalled": total(intersect(lease, stalled))}
        for name, value in figures.items():
            out[name] += value
        out["per_worker"][wid] = round(figures["billed"] - figures["held"], 2)
    return out
