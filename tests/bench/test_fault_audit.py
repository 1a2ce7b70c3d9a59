"""The fault suite's accounting (bench/fault_audit.py): what it reads from Redis' AOF and the learner's reports."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import fault_audit as fa  # noqa: E402

KEY = "echo2:job:1:trajectories"


def resp(*args: str) -> bytes:
    return f"*{len(args)}\r\n".encode() + b"".join(f"${len(a)}\r\n{a}\r\n".encode() for a in args)


def write_aof(directory: Path, *files: bytes) -> Path:
    aof = directory / "appendonlydir"
    aof.mkdir()
    lines = ["file appendonly.aof.1.base.rdb seq 1 type b"]
    for i, data in enumerate(files, start=1):
        (aof / f"appendonly.aof.{i}.incr.aof").write_bytes(data)
        lines.append(f"file appendonly.aof.{i}.incr.aof seq {i} type i")
    (aof / "appendonly.aof.manifest").write_text("\n".join(lines) + "\n")
    return aof


def test_the_stream_is_replayed_across_a_restart_and_a_torn_tail(tmp_path):
    before = resp("MULTI") + resp("XADD", KEY, "1-0", "data", "x") + resp("HINCRBY", "c", "accepted_groups", "1") + \
        resp("EXEC") + resp("XADD", KEY, "2-0", "data", "y") + resp("XADD", "other", "3-0", "a", "b") + \
        resp("XDEL", KEY, "1-0") + resp("XADD", KEY, "9-0", "data", "torn")[:-7]  # SIGKILL mid-write
    after = resp("XADD", KEY, "4-0", "data", "z") + resp("DEL", KEY, "echo2:job:1:prompts") + \
        resp("XADD", KEY, "5-0", "data", "late")
    stream = fa.stream_audit(fa.aof_commands(write_aof(tmp_path, before, after)), KEY)
    assert stream.added == {b"1-0", b"2-0", b"4-0", b"5-0"}
    assert stream.deleted == {b"1-0"}
    assert stream.leftover == 2  # 2-0 and 4-0 were in the stream when the site dropped it


def metric(step: int, entries: list[str], lag: int = 1) -> dict:
    return {"step": step, "max_staleness": lag, "wait_s": 1.0, "t_train": 1.0,
            "extra": {"entries": entries, "staleness_histogram": {str(lag): 2 * len(entries)}}}


def test_lost_and_twice_trained_groups_are_counted_in_records():
    metrics = [metric(1, ["1-0", "2-0"]), metric(2, ["2-0", "3-0"], lag=3), metric(4, ["6-0"])]
    summary = {"counters": {"accepted_groups": 8, "accepted_records": 16}, "dropped_stale": 2}
    stream = fa.StreamAudit(added={b"1-0", b"2-0", b"3-0", b"4-0", b"5-0", b"6-0", b"7-0", b"8-0"},
                            deleted={b"1-0", b"2-0", b"3-0", b"4-0", b"5-0", b"6-0"}, leftover=2)
    row = fa.audit(metrics, summary, stream, group_size=2)
    assert (row["accepted"], row["trained"], row["trained_twice"], row["max_staleness"]) == (16, 10, 2, 3)
    # 8 groups: 4 distinct trained, 1 dropped stale, 2 left in the stream -> 1 lost (2 records)
    assert row["lost"] == 2
    assert any("step(s) 3" in note for note in row["notes"])
    assert any("2 groups were deleted from the stream untrained, 1 reported" in note for note in row["notes"])


def test_throughput_is_back_when_a_window_after_the_fault_reaches_the_level_before():
    rates = [10] * 10 + [0] * 6 + [10] * 10  # records per second: 6 s without any after the fault at t = 10
    samples, total = [], 0
    for t, rate in enumerate(rates):
        samples.append(fa.Sample(float(t), "running", t, total, [1], 0.0))
        total += rate
    back, level = fa.throughput_back(samples, 10.0, window=3.0, before=5.0)
    assert level == 10.0 and back == 6.0
    assert fa.throughput_back(samples[:14], 10.0, window=3.0, before=5.0)[0] is None


def test_a_restarted_agent_is_ready_once_its_new_lines_say_it_installed_a_snapshot(tmp_path):
    log = tmp_path / "agent-a.log"
    log.write_bytes(b"10:00:00 agent: installed snapshot v4 of job 1 (0.1s after publication, via parent)\n")
    tail = fa.AgentLogTail(log, from_end=True)  # the killed process' lines are not the restarted one's
    tail.poll(1.0)
    with log.open("ab") as fh:
        fh.write(b"10:00:05 agent: connected to ws://x/ws/agent/ as worker 1\n10:00:06 agent: installed snap")
    tail.poll(2.0)
    assert tail.ready == []
    with log.open("ab") as fh:
        fh.write(b"shot v0 of job 1 (9.1s after publication, via cache)\n")
    tail.poll(3.0)
    assert tail.ready == [3.0] and tail.steps == []


def test_the_pool_is_judged_on_its_own_allowance_where_the_fault_has_one():
    row = {"fault": "worker-kill", "completed": True, "status": "completed", "lost": 0, "trained_twice": 0,
           "max_staleness": 3, "injected_at": 1.0, "step_s": 0.9, "pool_s": 8.0, "allowed_s": 10.5,
           "allowed_pool_s": 7.0}
    assert fa.criteria(row, 3) == ["pool throughput back after 8.0 s > 7.0 s allowed"]
    assert fa.criteria({**row, "allowed_pool_s": None}, 3) == [
        "no bound on the pool's recovery: the restarted component was never seen running"]
    assert fa.criteria({k: v for k, v in row.items() if k != "allowed_pool_s"}, 3) == []


def test_step_period_counts_the_steps_a_poll_saw_together() -> None:
    """Seven steps a second, seen by polls twice a second: stamps come in bunches, the period is still 1/7 s."""
    steps = [((step // 3.5 + 1) / 2, step) for step in range(21)]  # stamped by the poll after it: 3 or 4 a poll
    assert abs(fa.step_period(steps, before=10.0) - 1 / 7) < 0.03
    assert fa.step_period(steps, before=0.0) is None  # nothing seen yet
    assert fa.step_period([(1.0, 4), (1.0, 5)], before=2.0) == 0.0


def test_after_a_learner_kill_the_next_step_is_the_restarted_learners() -> None:
    tail = fa.LogTail(Path("/nonexistent"))
    tail.steps = [(9.8, 30), (10.02, 31), (14.0, 31), (14.1, 32)]  # step 31 written before the kill, read after
    tail.ready = [0.0, 13.9]  # the first start, then the restart set up
    assert fa.step_recovery(tail, 10.0, restarted=True) == pytest.approx(4.0)
    assert fa.step_recovery(tail, 10.0, restarted=False) == pytest.approx(0.02)  # any other fault: the next line
    assert fa.step_recovery(tail, 20.0, restarted=True) is None


def test_what_detects_a_fault_bounds_its_recovery() -> None:
    from faults import FAULTS
    from faults.base import LEASE_TIMEOUT_S, RECONNECT_CAP_S, REDIS_BACKOFF_S

    def detection_s(name: str, *, down: float, restart: float | None) -> float:
        return FAULTS[name].detection_s(down=down, restart=restart)

    assert detection_s("worker-kill", down=0.0, restart=None) == LEASE_TIMEOUT_S
    assert detection_s("redis-restart", down=2.0, restart=None) == 2.0 + REDIS_BACKOFF_S
    assert detection_s("site-outage", down=60.0, restart=None) == 60.0 + min(60.0, RECONNECT_CAP_S)
    assert detection_s("learner-kill", down=0.0, restart=4.5) == 4.5
    assert detection_s("learner-kill", down=0.0, restart=None) == 0.0
