"""Bills against leases in the fault suite (bench/fault_bills.py): intervals, lease tracking, the reconciliation, and
"lost" only once the job ended (bench/fault_audit.py criteria)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import fault_audit as fa  # noqa: E402
import fault_bills as fb  # noqa: E402


def test_interval_algebra():
    a = fb.union([(5, 7), (0, 2), (1, 3), (9, 9)])
    assert a == [(0, 3), (5, 7)]
    b = [(2, 6)]
    assert fb.intersect(a, b) == [(2, 3), (5, 6)]
    assert fb.minus(a, b) == [(0, 2), (6, 7)]
    assert fb.total(a) == 5


def xclaim(consumer: str, entry: str, at_ms: int, *extra: bytes) -> list[bytes]:
    """A delivery as Redis writes it to its append-only file."""
    return [b"XCLAIM", b"k", b"g", consumer.encode(), b"0", entry.encode(), b"TIME", str(at_ms).encode(),
            b"RETRYCOUNT", b"1", b"FORCE", b"JUSTID", b"LASTID", entry.encode(), *extra]


def test_leases_from_the_append_only_file_are_exact_to_the_millisecond():
    log = [
        xclaim("worker-7", "1-0", 100_000),
        [b"XADD", b"traj", b"100250-0", b"lease_id", b"1-0"],  # its group appended: the clock
        [b"XACK", b"k", b"g", b"1-0"],  # and acknowledged in the same script
        xclaim("worker-7", "2-0", 100_250),  # the next lease at the same instant: one span
        xclaim("worker-7", "2-0", 100_280),  # renewed: held on
        xclaim("worker-9", "3-0", 100_300),  # a lease of 10 ms, between any two samples 0.1 s apart
        [b"XADD", b"traj", b"100310-0", b"lease_id", b"3-0"],
        [b"XACK", b"k", b"g", b"3-0"],
        xclaim("worker-9", "2-0", 101_000),  # worker 7's lease taken by worker 9: it ends there for 7
        [b"XADD", b"traj", b"101200-0"],
        xclaim("returned", "2-0", 101_200 - 86_400_000),  # handed back: dated a day back, happened now
        xclaim("worker-5", "4-0", 101_300),  # never answered: held until its timeout
        [b"XADD", b"traj", b"200000-0"],
    ]
    held = fb.aof_leases(log, key="k", group="g", timeout_s=30)
    assert held["worker-7"] == [(100.0, 101.0)]
    assert held["worker-9"] == [(pytest.approx(100.3), pytest.approx(100.31)), (101.0, 101.2)]
    assert held["worker-5"] == [(101.3, 131.3)]
    assert "returned" not in held
    # another stream or group is not this one's
    assert fb.aof_leases([xclaim("worker-1", "1-0", 5)], key="other", group="g", timeout_s=30) == {}


def test_reconcile_counts_over_under_closed_and_stalled():
    billed = {7: [(0.0, 10.0), (20.0, 25.0)]}
    held = {7: [(0.0, 10.0), (20.0, 22.0)]}
    sessions = {7: [(0.0, 23.0)]}  # the socket closed at 23: held 20-22 counts, the bill 23-25 does not
    out = fb.reconcile(billed=billed, held=held, sessions=sessions, stalled=[(21.0, 30.0)], until=30.0)
    assert out["billed"] == 15 and out["held"] == 12
    assert out["over"] == 3 and out["under"] == 0
    assert out["billed_closed"] == 2  # 23-25
    assert out["billed_stalled"] == 4 and out["held_stalled"] == 1
    assert out["per_worker"] == {7: 3.0}


def _row(**kw):
    row = {"fault": "none", "completed": True, "status": "completed", "status_reason": "", "lost": 0,
           "trained_twice": 0, "max_staleness": 1, "injected_at": None}
    row.update(kw)
    return row


def test_lost_is_judged_only_once_the_job_ended_and_bills_must_match():
    assert fa.criteria(_row(), 3) == []
    # a job the bench gave up on: lost unknown (None), the row fails on the job's status alone
    assert fa.criteria(_row(completed=False, status="running", lost=None), 3) == ["job running"]
    bills = {"billed": 50.0, "held": 47.5, "billed_closed": 2.0, "billed_stalled": 0.0, "held_stalled": 0.0,
             "per_worker": {1: 0.5, 2: 2.0}}
    reasons = fa.criteria(_row(bills=bills), 3)
    assert any("socket closed" in r for r in reasons) and any("leases held 47.5" in r for r in reasons)
    # each worker's bill within a second of its leases passes, whatever the sum of the measuring's jitter
    assert fa.criteria(_row(bills=dict(bills, billed_closed=0.5, per_worker={1: 0.8, 2: 0.9})), 3) == []


def test_site_records_bill_generating_less_credits_and_sessions(tmp_path):
    import sqlite3

    db = tmp_path / "site.sqlite3"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE marketplace_ledgerentry (worker_id, job_id, state, started_at, at, seconds)")
    con.execute("CREATE TABLE marketplace_workersession (worker_id, started_at, ended_at)")
    rows = [(7, 1, "generating", "2026-01-01 00:00:00", "2026-01-01 00:00:10", 10),
            (7, 1, "installing", "2026-01-01 00:00:10", "2026-01-01 00:00:12", 2),
            (7, 2, "generating", "2026-01-01 00:00:00", "2026-01-01 00:00:30", 30),  # another job
            (7, 1, "credit", "2026-01-01 00:00:06", "2026-01-01 00:01:00", -4)]  # 6-10 s given back
    con.executemany("INSERT INTO marketplace_ledgerentry VALUES (?, ?, ?, ?, ?, ?)", rows)
    con.execute("INSERT INTO marketplace_workersession VALUES (7, '2026-01-01 00:00:00', NULL)")
    con.commit()
    con.close()
    t0 = fb._unix("2026-01-01 00:00:00")
    billed, sessions = fb.site_records(db, 1, until=t0 + 60)
    assert billed == {7: [(t0, t0 + 6)]}
    assert sessions == {7: [(t0, t0 + 60)]}
