"""bench/bench_wan.py's rows beside the simulator (bench/sim_wan.py), from saved rows alone: no namespaces, no run
directory. ``bench/data/wan-row-paper-n4-r3.json`` is run r3 of bench/data/wan-sim-2026-12-05.json (paper, N = 4)
with what bench/wan/run.py's calibration now carries (each step's timing and created_at, each publication's
published_at, the timeline, each agent's installs), rebuilt from that run's results.json and logs, and without the
step timing and process latencies sim_wan had computed from them."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import bench_wan  # noqa: E402
import sim_wan  # noqa: E402

from bench.wan import profile  # noqa: E402

SAVED = json.loads((BENCH / "data" / "wan-sim-2026-12-05.json").read_text())
CARRIED = json.loads((BENCH / "data" / "wan-row-paper-n4-r3.json").read_text())


def test_a_row_that_carries_its_record_needs_no_run_directory() -> None:
    assert not Path(CARRIED["logs"]).exists() and "step_timing" not in CARRIED
    original = next(r for r in SAVED if r.get("run") == CARRIED.get("run") and r["profile"] == "paper"
                    and r["agents"] == 4)
    # the same figures sim_wan measured from the run's results.json and agents' logs when the directory existed
    assert sim_wan.step_timing(CARRIED) == pytest.approx(original["step_timing"])
    assert sim_wan.process_latency(CARRIED) == pytest.approx(original["process_latency"])
    assert sim_wan.process_latency(CARRIED)["install"] > 0


def test_an_old_row_without_its_record_or_directory_gets_none() -> None:
    row = copy.deepcopy(CARRIED)
    for key in ("timeline", "installed"):
        row["calibration"].pop(key)
    assert sim_wan.run_record(row) is None and sim_wan.step_timing(row) is None


def test_finish_puts_both_models_and_their_errors_beside_the_measured_figures() -> None:
    row = copy.deepcopy(CARRIED)
    topology = profile.load(row["profile"]).with_agents(row["agents"])
    done = bench_wan.finish(row, topology, 1)
    assert "sim_note" not in done
    real = done["t_bcast_s"]
    for prefix in ("sim_links", "sim_proc"):
        sim = done[f"{prefix}_t_bcast_s"]
        assert 0.3 * real < sim < 3 * real
        assert done[f"{prefix}_err"] == pytest.approx(100 * (sim - real) / real)
        bubble = done[f"{prefix}_bubble"]
        assert 0 < bubble < 1
        assert done[f"{prefix}_bubble_err"] == pytest.approx(100 * (bubble - done["sim_real_bubble"])
                                                             / done["sim_real_bubble"])
    # the measured process latencies add time: +proc. predicts a longer broadcast than the links alone
    assert done["sim_proc_t_bcast_s"] > done["sim_links_t_bcast_s"]
    printed = bench_wan.table([done])
    assert "links s" in printed and "+proc. s" in printed and format(done["sim_proc_err"], "+.0f") in printed


def test_a_row_the_simulator_cannot_calibrate_on_says_why() -> None:
    row = copy.deepcopy(CARRIED)
    row["calibration"]["links"] = {}
    done = bench_wan.finish(row, profile.load("paper").with_agents(4), 1)
    assert done["sim_note"].startswith("the simulator could not be calibrated on this run")
    assert done.get("sim_proc_t_bcast_s") is None and "-" in bench_wan.table([done])


def test_help_answers_without_building_anything() -> None:
    import subprocess

    done = subprocess.run([sys.executable, str(BENCH / "bench_wan.py"), "--help"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and "--sim-seeds" in done.stdout and "bench/sim_wan.py" in done.stdout
