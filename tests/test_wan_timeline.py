"""The WAN bench's measuring tools (bench/wan/cpu.py, timeline.py, wire.py's plan): CPU read from /proc for real
processes, cores per window, and a version's hops laid out on their chains."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from bench.wan import cpu, timeline
from bench.wan.wire import plan


def test_the_sampler_sees_a_busy_process_use_about_a_core_and_an_idle_one_none():
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    procs = [("agent-a0", busy), ("proxy-a0", idle)]
    sampler = cpu.CpuSampler(cpu.stack_sessions(procs), interval=0.2).start()
    try:
        time.sleep(2.0)
    finally:
        sampler.stop()
        spent = cpu.process_ticks()[busy.pid][1] / cpu.HZ  # its whole life's CPU, read after the last sample
        for proc in (busy, idle):
            proc.kill()
            proc.wait()
    load = cpu.window(sampler.samples, sampler.samples[1][0], sampler.samples[-1][0])
    assert load is not None and load["cores"] >= 1
    counted = sampler.samples[-1][3]["agent-a0"]  # from its first sample on: less than its whole life's
    assert 0 < counted <= spent + 0.02
    # a loaded shared machine may give the spinning one a small share of a core, but it is the busy one
    assert load["procs"]["agent-a0"] <= 1.1 and load["procs"]["agent-a0"] > 5 * load["procs"]["proxy-a0"] + 0.02
    assert load["groups"]["agents"] == load["procs"]["agent-a0"] and load["machine"] >= load["stack"] * 0.9
    assert 0 < load["busy"] <= 1


def test_a_window_needs_two_samples_around_it():
    samples = [(10.0, 0.0, 0.0, {"learner": 0.0}), (12.0, 2.0, 4.0, {"learner": 1.0})]
    load = cpu.window(samples, 10.5, 11.5)
    assert load["procs"] == {"learner": 0.5} and load["machine"] == 1.0 and load["busy"] == 0.5
    assert cpu.window(samples[:1], 10.0, 11.0) is None
    assert cpu.group_of("celery-worker") == "site" and cpu.group_of("proxy-site") == "proxies"


def hop(parent: str, child: str, t0: float, t1: float) -> dict:
    return {"parent": parent, "child": child, "t0": t0, "t1": t1, "mb": 16.4, "mbit_s": 40.0, "link_mbit_s": 50.0}


def test_a_versions_hops_lie_on_their_chain_with_each_hops_lag_after_its_parent():
    published = "2026-12-05T01:00:00+00:00"
    t = timeline.wall(published)
    hops = [hop("learner", "a0", t + 0.1, t + 3.0), hop("a0", "a1", t + 0.1, t + 3.2),
            hop("a1", "a2", t + 0.1, t + 3.5), hop("learner", "a3", t + 0.1, t + 2.9),
            hop("learner", "a0", t + 100, t + 103)]  # the next version's, left out
    snaps = [{"version": 1, "published_at": published, "t_bcast": 3.6, "manifest": {}},
             {"version": 2, "published_at": "2026-12-05T01:01:30+00:00", "t_bcast": 3.0, "manifest": {}}]
    first, second = timeline.versions(snaps, hops, installed={1: [3.0, 3.6, 3.3]})
    assert [(h["child"], h["depth"]) for h in first["hops"]] == [("a0", 1), ("a3", 1), ("a1", 2), ("a2", 3)]
    assert first["depth"] == 3 and first["last_byte_s"] == pytest.approx(3.5)
    assert first["lag_s"] == pytest.approx(0.25) and first["seed_s"] == pytest.approx(2.85)
    assert first["over_seed"] == pytest.approx((3.5 - 0.1) / 2.85)
    assert first["installs_s"] == [3.0, 3.3, 3.6] and len(second["hops"]) == 1
    summary = timeline.summary([first, second])
    assert summary["versions"] == 2 and summary["lag_s"] == pytest.approx(0.25)
    assert any("a1 -> a2" in line and "lag 0.30" in line for line in timeline.lines([first]))


def test_the_wire_runs_chains_of_consecutive_agents():
    assert plan(["a0", "a1", "a2", "a3", "a4"], 2) == [["a0", "a1", "a2"], ["a3", "a4"]]
    assert plan(["a0"], 4) == [["a0"]]
