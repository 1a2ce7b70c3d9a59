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


class FakeRedis:
    """A transaction of TIME and XPENDING, answered from a script per sample: (server time, [(entry, consumer,
    idle ms, deliveries)])."""

    def __init__(self, answers):
        self.answers = iter(answers)

    def pipeline(self, transaction):
        return self

    def time(self):
        pass

    def xpending_range(self, key, group, *, min, max, count):  # noqa: A002 - redis-py's names
        pass

    def execute(self):
        now, pending = next(self.answers)
        return [(int(now), round(now % 1 * 1e6)), [
            {"message_id": e.encode(), "consumer": c.encode(), "time_since_delivered": idle, "times_delivered": n}
            for e, c, idle, n in pending]]


def test_lease_watch_holds_a_lease_from_delivery_to_its_disappearance():
    watch = fb.LeaseWatch(FakeRedis([(100.0, [("1-0", "worker-7", 500, 1)]), (101.0, [("1-0", "worker-7", 1500, 1)]),
                                     (102.0, [("1-0", "worker-9", 200, 2)]), (103.0, [])]), "k", "g")
    for _ in range(4):
        watch.sample()
    held = watch.held(timeout_s=10)
    # worker 7: delivered at 99.5, seen last at 101, gone at 102: held to the middle, 101.5
    assert held["worker-7"] == [(99.5, 101.5)]
    # handed to worker 9 (a second delivery) at 101.8, gone at 103
    assert held["worker-9"] == [(pytest.approx(101.8), 102.5)]
    # a lease past its timeout is not held any more, whatever the stream still says
    assert fb.LeaseWatch(FakeRedis([]), "k", "g").held(timeout_s=1) == {}
    assert watch.held(timeout_s=1)["worker-7"] == [(99.5, 100.5)]


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
