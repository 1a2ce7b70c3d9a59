"""The fleet bench's job rows (bench/fleet/jobrow.py): groups told accepted against groups stored, from the AOF."""

from __future__ import annotations

from bench.fleet.jobrow import passes, stored_groups, verdict_audit


def xadd(job: int, lease: str, worker: int) -> list[bytes]:
    return [b"XADD", f"echo2:job:{job}:trajectories".encode(), b"1-0", b"lease_id", lease.encode(),
            b"worker_id", str(worker).encode(), b"data", b"..."]


def test_told_accepted_is_checked_against_every_jobs_stream_and_stored_twice_counted():
    commands = [xadd(1, "a", 7), xadd(2, "b", 7), xadd(2, "c", 9), xadd(2, "c", 9), [b"XACK", b"k", b"g", b"a"]]
    this_job = stored_groups(commands, "echo2:job:2:trajectories")
    assert this_job == [("b", 7), ("c", 9), ("c", 9)]
    assert stored_groups(commands) == [("a", 7), *this_job]
    # "a" was accepted into an earlier job still running; "x" was told accepted and stored nowhere: a wrong verdict
    v = verdict_audit({"a", "b", "x"}, this_job, emulated={7}, everywhere=stored_groups(commands))
    assert v == {"told_accepted": 3, "stored": 2, "stored_emulated": 1, "told_elsewhere": 1, "told_not_stored": 1,
                 "stored_not_told": 0, "stored_twice": 1}
    reasons = passes({"status": "completed", "audit": {"lost": 0, "trained_twice": 0}, "verdicts": v})
    assert reasons == ["1 told accepted not stored, 1 stored twice"]
