"""bench/sim_wan.py: the simulator configured from a WAN run's row (bench/data/wan-sim-2026-12-05.json, rows of
bench/bench_wan.py with the runs' measured step timing and process latencies kept), never from the figures compared."""

from __future__ import annotations

import copy
import dataclasses
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import sim_wan  # noqa: E402

ROWS = json.loads((BENCH / "data" / "wan-sim-2026-12-05.json").read_text())


def paper_row() -> dict:
    return copy.deepcopy(next(r for r in ROWS if r["profile"] == "paper" and r["agents"] == 4 and r["t_bcast_s"]))


def test_the_network_is_the_profiles_links_and_the_learner_the_runs_measurements() -> None:
    row = paper_row()
    config = sim_wan.wan_config(row["calibration"], seed=0, timing=row["step_timing"],
                                processes=row["process_latency"])
    wan = config.net.wan
    assert {w: (link.up_bps * 8 / 1e6, link.rtt_s) for w, link in wan.workers} == {
        int(w): (x["up_mbit"], x["rtt_ms"] / 1000) for w, x in row["calibration"]["links"].items()}
    assert wan.learner.up_bps == row["calibration"]["b0_bps"]
    assert config.lease_latency_s == pytest.approx((40 + 10) / 1000)  # the agent's and the site's round trips
    assert config.learner.t_train_steps == tuple(m["t_train"] for m in row["calibration"]["metrics"])
    assert wan.publish_s == row["step_timing"]["publish_lag"]
    # each install drawn around the run's median install, spread as the held-out runs' installs were
    assert wan.install_s == pytest.approx(sim_wan.INSTALL_MEAN_PER_MEDIAN * row["process_latency"]["install"])
    assert wan.install_cv == sim_wan.INSTALL_CV
    assert not hasattr(sim_wan.wan_config(row["calibration"], seed=0).net.wan, "install_cv")  # links only: none


def test_the_simulated_broadcast_follows_the_links_not_the_measured_t_bcast() -> None:
    row = paper_row()
    versions = [s["version"] for s in row["calibration"]["snapshots"] if s["version"] >= 1 and s["t_bcast"]]
    config = sim_wan.wan_config(row["calibration"], seed=0, timing=row["step_timing"])
    base = sim_wan.simulated(config, 2, versions)
    faster = dataclasses.replace(config, net=dataclasses.replace(config.net, wan=dataclasses.replace(
        config.net.wan, learner=dataclasses.replace(config.net.wan.learner, up_bps=4 * config.net.wan.learner.up_bps),
        workers=tuple((w, dataclasses.replace(x, up_bps=4 * x.up_bps, down_bps=4 * x.down_bps))
                      for w, x in config.net.wan.workers))))
    assert sim_wan.simulated(faster, 2, versions)["t_bcast"] < 0.5 * base["t_bcast"]


def test_each_row_gets_real_and_simulated_figures_over_the_same_steps() -> None:
    out = sim_wan.wan_rows([paper_row()], seeds=1)[0]
    assert out["row"] == "paper chain N=4"
    for key in ("t_bcast", "bubble", "stale"):
        assert out[key] is not None and out[f"sim_{key}"] is not None and out[f"links_{key}"] is not None
    assert 0 < out["bubble"] < 1 and 0 < out["sim_bubble"] < 1


def test_the_feeder_cycle_is_the_fastest_decile_of_the_runs_top_up_gaps() -> None:
    # one top-up's XADDs straddling a millisecond (0, 3) count once; the gaps are 97, 60, 240, 600, 60, 940 ms
    cal = {"top_ups": [0, 3, 100, 160, 400, 1000, 1060, 2000]}
    assert sim_wan.feeder_cycle(cal) == pytest.approx(0.060)
    assert sim_wan.feeder_cycle({"top_ups": [0, 100, 200, 300, 400]}) is None  # four gaps: too few to say
    assert sim_wan.feeder_cycle({}) is None


def test_the_top_up_takes_the_feeder_cycle_measured_else_the_protocols_round_trips() -> None:
    row = paper_row()
    cal = row["calibration"]
    read = (cal["site_rtt_ms"] + cal["learner_rtt_ms"]) / 1000
    plain = sim_wan.wan_config(cal, seed=0, timing=row["step_timing"])
    assert plain.top_up_latency_s == pytest.approx(1.5 * read) and plain.read_rtt_s == pytest.approx(read)
    measured = sim_wan.wan_config(cal, seed=0, timing=row["step_timing"], feeder_s=0.25)
    assert measured.top_up_latency_s == pytest.approx(0.25 - read)  # the read that asks for it comes first
    assert sim_wan.wan_config(cal, seed=0, feeder_s=0.001).top_up_latency_s == pytest.approx(1.5 * read)


def test_every_stored_run_measured_a_feeder_slower_than_its_round_trips() -> None:
    # what the model takes from the runs: the learner's top-ups follow each other 0.06-0.33 s apart at the fastest,
    # where the protocol's round trips alone would allow 0.03-0.06 s
    for row in ROWS:
        cal = row["calibration"]
        cycle = sim_wan.feeder_cycle(cal)
        assert cycle is not None and cycle > 1.5 * (cal["site_rtt_ms"] + cal["learner_rtt_ms"]) / 1000, row["run"]


def test_the_rows_inputs_name_the_feeder_cycle_and_the_protocol_model_has_none() -> None:
    out = sim_wan.wan_rows([paper_row()], seeds=1)[0]
    assert out["inputs"]["feeder_s"] == sim_wan.feeder_cycle(paper_row()["calibration"])
    assert sim_wan.wan_rows([paper_row()], seeds=1, feeder=False)[0]["inputs"]["feeder_s"] is None


def test_the_install_spread_constants_are_the_held_out_runs_measurement() -> None:
    check = json.loads((BENCH / "data" / "wan-sim-2026-12-05-check.json").read_text())
    mean, cv = sim_wan.install_spread(check)
    assert mean == pytest.approx(sim_wan.INSTALL_MEAN_PER_MEDIAN, abs=0.005)
    assert cv == pytest.approx(sim_wan.INSTALL_CV, abs=0.005)
    with pytest.raises(ValueError, match="no row with its installs"):
        sim_wan.install_spread(ROWS)  # the 12 rows carry medians only


def test_drawn_installs_spread_around_the_mean_and_are_reproducible() -> None:
    row = paper_row()
    config = sim_wan.wan_config(row["calibration"], seed=0, timing=row["step_timing"],
                                processes=row["process_latency"])
    wide = dataclasses.replace(config, net=dataclasses.replace(config.net, wan=dataclasses.replace(
        config.net.wan, install_s=0.5)))
    from simulator.fleet import FleetSim

    sim = FleetSim(wide)
    draws = [sim._install_seconds() for _ in range(4000)]
    mean = sum(draws) / len(draws)
    sd = (sum((x - mean) ** 2 for x in draws) / len(draws)) ** 0.5
    assert mean == pytest.approx(0.5, rel=0.05) and sd / mean == pytest.approx(sim_wan.INSTALL_CV, rel=0.1)
    assert FleetSim(wide)._install_seconds() == draws[0]  # its own generator, seeded by the run's seed


def test_the_simulated_part_is_the_relays_and_older_rows_keep_theirs() -> None:
    from dataplane.broadcast.framing import DEFAULT_PART_BYTES
    from simulator.model import WanSpec

    assert WanSpec.part_bytes == DEFAULT_PART_BYTES  # the simulator may not import dataplane's framing
    assert sim_wan.part_bytes({"calibration": {"part_bytes": 65536}}) == 65536
    assert sim_wan.part_bytes({"calibration": {}}) == sim_wan.part_bytes({}) == 256 * 1024
