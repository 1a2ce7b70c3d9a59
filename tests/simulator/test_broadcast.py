"""The broadcast model against the paper's closed forms (section 4.2, appendix C.3, section 5.5.1)."""

from __future__ import annotations

import math

import pytest

from simulator.broadcast import closed_form, flow_line_finish, install_times, plan_for, star_finish, t_bcast, water_fill
from simulator.fleet import simulate
from simulator.model import MBIT, ControlSpec, LearnerSpec, NetSpec, SimConfig, WorkerSpec

M, C, BW = 400e6, 4 * 2**20, 100 * MBIT


def test_a_flow_line_finishes_at_the_sum_of_one_chunk_per_stage_plus_the_rest_at_the_bottleneck() -> None:
    # 4 chunks of 1 byte; hop rates 2 then 1 B/s: stage 1 holds all at 0.5 + 3 x 0.5, stage 2 at 1.5 + 3 x 1
    assert flow_line_finish([2.0, 1.0], size=4, chunk=1) == pytest.approx([2.0, 4.5])


@pytest.mark.parametrize(("n", "ratio"), [(4, 4), (8, 4), (13, 3), (64, 6)])
def test_uniform_chains_match_the_papers_closed_form(n: int, ratio: int) -> None:
    bandwidth = dict.fromkeys(range(1, n + 1), BW)
    plan = plan_for("chain", bandwidth, b0_bps=ratio * BW)
    times = install_times(plan, bandwidth, size=M, chunk=C, b0_bps=ratio * BW)
    longest = max(len(c) for c in plan.chains)
    assert len(plan.chains) == min(n, ratio)
    assert max(times.values()) == pytest.approx(M / BW + (longest - 1) * C / BW, rel=1e-3)
    assert max(times.values()) == pytest.approx(closed_form("chain", n, size=M, bw=BW, b0=ratio * BW, chunk=C),
                                                rel=1e-3)


@pytest.mark.parametrize("n", [2, 4, 9, 30])
def test_star_limited_is_max_of_line_rate_and_shared_uplink(n: int) -> None:
    bandwidth = dict.fromkeys(range(n), BW)
    times = install_times(plan_for("star-limited", bandwidth, b0_bps=4 * BW), bandwidth, size=M, chunk=C,
                          b0_bps=4 * BW)
    assert list(times.values()) == pytest.approx([max(M / BW, n * M / (4 * BW))] * n)


def test_max_min_fair_sharing_gives_slow_flows_their_cap_and_splits_the_rest() -> None:
    assert water_fill({1: 1.0, 2: 5.0, 3: 5.0}, 7.0) == {1: 1.0, 2: 3.0, 3: 3.0}
    done = star_finish({1: 1.0, 2: 10.0}, size=10.0, uplink=4.0)
    # worker 2 runs at 3 B/s until 10/3 s, then alone at 4 B/s; worker 1 at 1 B/s throughout
    assert done[2] == pytest.approx(10 / 3)
    assert done[1] == pytest.approx(10.0)


def test_t_bcast_is_the_q_quantile_of_installs() -> None:
    assert t_bcast([5.0, 1.0, 3.0, 2.0, 4.0, 6.0, 7.0, 8.0, 9.0, 10.0], q=1 / 1.1) == 10.0
    assert t_bcast([5.0, 1.0, 3.0, 2.0], q=0.5) == 2.0


def test_a_simulated_chain_broadcast_matches_the_closed_form() -> None:
    """Every publication of a live simulated run installs on the q-quantile worker when the formula says."""
    workers = [WorkerSpec(i, 0.35, 0.5) for i in range(1, 9)]
    config = SimConfig(workers, LearnerSpec(t_train=100.0, batch=32, group=8, staleness=3, kappa=2,
                                            snapshot_bytes=M), NetSpec(b0_bps=3 * BW, chunk_bytes=C),
                       ControlSpec(activation="fixed", fixed_ids=tuple(range(1, 9)), controller=False), steps=8)
    result = simulate(config)
    expected = M / BW + (math.ceil(8 / 3) - 1) * C / BW  # 3 chains of 3, 3, 2: the q = 1/1.1 worker is a tail
    assert len(result.t_bcast) == 3  # v2, v4, v6; v8 is published as the run ends
    assert all(t == pytest.approx(expected, rel=1e-6) for t in result.t_bcast.values())
