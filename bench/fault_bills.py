"""Bills against leases in the fault suite (bench/bench_faults.py): what the site billed each worker against the
seconds it held a lease, both read from the site's own records.

- Leases: the job's prompt stream in the run's private Redis (``dataplane.replay``: a lease is an entry pending
  under the worker's consumer), replayed from Redis' append-only file by :func:`aof_leases`: a lease is held from
  its delivery until its entry leaves the consumer (group accepted, handed back, claimed by another) or its lease
  timeout runs out, whichever is first, each to Redis' millisecond.
- Sockets: the site's ``WorkerSession`` rows (opened at the welcome, closed when the site saw the socket go).
- Bills: the site's ``LedgerEntry`` rows of the job in state ``generating`` (each an interval ``[started_at, at]``),
  less its ``credit`` rows (billed time given back: ``[started_at, started_at - seconds]``).

The rule the bill should follow (``marketplace.core.billing.observed_state``): generating = a lease outstanding and
the socket open. So "held" is the lease intervals clipped to the worker's open sessions, and the row shows billed,
held, billed but not held (over) and held but not billed (under), worker-seconds summed over workers.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterable
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


STREAM_ID = re.compile(rb"^\d+-\d+$")


def aof_leases(commands: Iterable[list[bytes]], *, key: str, group: str, timeout_s: float) -> dict[str, list[Interval]]:
    """Per consumer, the union of its leases of stream ``key``'s group ``group``, replayed from Redis' append-only
    file (``fault_audit.aof_commands``), exact to Redis' millisecond: Redis logs every delivery (``XREADGROUP``,
    ``XAUTOCLAIM``, ``XCLAIM``) as an ``XCLAIM`` naming the consumer and its time, and the return script's ``XACK``
    follows the ``XADD`` of the group, whose entry id is that moment. A lease is held from its delivery until it is
    acknowledged, delivered to another consumer (handed back, or taken once expired), or its timeout runs out since
    its delivery or last renewal (an ``XCLAIM`` to the same consumer). Sampling the pending entries instead, every
    0.1 s, missed leases shorter than the period and dated each end to half of it: not evenly, since a lease taken
    at the instant another ended hides an end dated late and shows one dated early."""
    name, grp = key.encode(), group.encode()
    clock = 0.0  # Redis' time as the file last said it
    owner: dict[bytes, tuple[str, float, float]] = {}  # entry -> (consumer, delivered, last renewed)
    spans: dict[str, list[Interval]] = {}

    def end(entry: bytes, at: float) -> None:
        held = owner.pop(entry, None)
        if held is not None:
            consumer, start, renewed = held
            spans.setdefault(consumer, []).append((start, min(at, renewed + timeout_s)))

    for args in commands:
        cmd = args[0].upper()
        if cmd == b"XADD":  # any stream's: its id is Redis' clock then
            entry = next((a for a in args[2:] if STREAM_ID.match(a)), None)
            if entry is not None:
                clock = max(clock, int(entry.split(b"-")[0]) / 1000)
            continue
        if len(args) < 2 or args[1] != name:
            continue
        if cmd in (b"DEL", b"UNLINK"):
            for entry in list(owner):
                end(entry, clock)
        elif cmd == b"XACK" and len(args) > 3 and args[2] == grp:
            for entry in args[3:]:
                end(entry, clock)
        elif cmd == b"XCLAIM" and len(args) > 5 and args[2] == grp:
            consumer, ids, options = args[3].decode(), [], {}
            i = 5
            while i < len(args) and STREAM_ID.match(args[i]):
                ids.append(args[i])
                i += 1
            while i < len(args):
                option = args[i].upper()
                if option in (b"IDLE", b"TIME", b"RETRYCOUNT", b"LASTID") and i + 1 < len(args):
                    options[option], i = args[i + 1], i + 2
                else:
                    i += 1
            # a hand-back claims as if idle for a day: its TIME is a day back, so the moment is the clock's
            at = int(options[b"TIME"]) / 1000 if b"TIME" in options else clock
            at = clock = max(at, clock)
            for entry in ids:
                held = owner.get(entry)
                if held is not None and held[0] == consumer:
                    owner[entry] = (consumer, held[1], at)  # renewed: its timeout starts again
                    continue
                end(entry, at)
                if consumer.startswith("worker-"):
                    owner[entry] = (consumer, at, at)
    for entry in list(owner):  # still pending at the end of the file
        end(entry, clock)
    return {consumer: union(v) for consumer, v in spans.items()}


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
