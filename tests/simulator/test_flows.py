"""The fluid flows of simulator/flows.py and the WAN broadcast of simulator/wan.py, against hand-computed times."""

from __future__ import annotations

import math

import pytest

from simulator.fleet import simulate
from simulator.flows import Flow, FlowNet
from simulator.model import MBIT, ControlSpec, LearnerSpec, Link, NetSpec, SimConfig, WanSpec, WorkerSpec


def finish_times(net: FlowNet) -> dict[tuple[int, int], float]:
    ends = {}
    while net.flows:
        t = net.next_event()
        assert t < math.inf, "a flow that never ends"
        for f in net.advance(t):
            ends[(f.version, f.child)] = t
    return ends


def test_flows_through_one_uplink_share_it_fairly() -> None:
    net = FlowNet({None: 2.0}, {1: 2.0, 2: 2.0}, part=0.5)
    net.add(Flow(1, 1, None, 4.0, 0.0))
    net.add(Flow(1, 2, None, 4.0, 0.0))
    assert finish_times(net) == pytest.approx({(1, 1): 4.0, (1, 2): 4.0})  # 1 B/s each


def test_a_relay_forwards_a_part_behind_its_parent() -> None:
    # learner -> 1 -> 2, every hop 1 B/s: the child trails by one part of 0.5 B
    net = FlowNet({None: 10.0, 1: 1.0}, {1: 1.0, 2: 1.0}, part=0.5)
    seed = net.add(Flow(1, 1, None, 4.0, 0.0))
    net.add(Flow(1, 2, 1, 4.0, 0.0, upstream=seed))
    assert finish_times(net) == pytest.approx({(1, 1): 4.0, (1, 2): 4.5})


def test_a_slower_second_hop_starts_once_its_parent_holds_a_part() -> None:
    net = FlowNet({None: 2.0, 1: 1.0}, {1: 5.0, 2: 5.0}, part=0.5)
    seed = net.add(Flow(1, 1, None, 4.0, 0.0))
    net.add(Flow(1, 2, 1, 4.0, 0.0, upstream=seed))
    assert finish_times(net) == pytest.approx({(1, 1): 2.0, (1, 2): 4.25})  # starts at 0.25, then 1 B/s


def test_an_overlapping_publication_halves_the_first_ones_rate() -> None:
    # v1 alone for 1 s at 1 B/s, then both at 0.5 B/s: v1 done at 3, v2 alone again from 3: done at 4
    net = FlowNet({None: 10.0}, {1: 1.0}, part=0.5)
    net.add(Flow(1, 1, None, 2.0, 0.0))
    net.add(Flow(2, 1, None, 2.0, 1.0))
    assert finish_times(net) == pytest.approx({(1, 1): 3.0, (2, 1): 4.0})


def test_a_flow_never_exceeds_its_window_over_the_round_trip() -> None:
    net = FlowNet({None: 100.0}, {1: 100.0}, part=0.5)
    net.add(Flow(1, 1, None, 4.0, 0.0, cap=2.0))
    assert finish_times(net) == pytest.approx({(1, 1): 2.0})


def wan_config(*, t_train: float, steps: int = 12, **wan) -> SimConfig:
    link = Link(50 * MBIT, 50 * MBIT, 0.04)
    spec = WanSpec(learner=Link(100 * MBIT, 100 * MBIT, 0.01), site=Link(math.inf, math.inf, 0.01),
                   workers=tuple((w, link) for w in range(1, 5)), **wan)
    workers = [WorkerSpec(w, 0.36, 50.0) for w in range(1, 5)]
    learner = LearnerSpec(t_train=t_train, batch=16, group=4, staleness=3, kappa=2, snapshot_bytes=16e6)
    return SimConfig(workers, learner, NetSpec(b0_bps=100 * MBIT, chunk_bytes=4 * 2**20, wan=spec),
                     ControlSpec(activation="fixed", fixed_ids=(1, 2, 3, 4), controller=False), steps=steps,
                     cv=0.0, lease_groups=2, lease_batch=True)


def test_one_broadcast_alone_takes_the_seeds_share_of_b0_plus_the_latencies() -> None:
    # publications 20 s apart never overlap: two chains of two, each seed at B0/2 = Bw (goodput 1448/1514)
    result = simulate(wan_config(t_train=10.0, steps=6, site_bandwidth=False))
    rate = 50 * MBIT * 1448 / 1514
    alone = 16e6 / rate + 256 * 1024 / rate  # the tail trails its seed by one part
    latency = 0.01 + 0.025 + 0.05 + 0.025  # learner -> site, site -> agent, the hello's round trip, the report
    assert result.t_bcast[2] == pytest.approx(alone + latency, rel=0.02)


def test_publications_faster_than_a_broadcast_overlap_and_slow_each_other() -> None:
    alone = simulate(wan_config(t_train=10.0, steps=6)).t_bcast[2]
    busy = simulate(wan_config(t_train=0.3))
    assert busy.t_bcast and max(busy.t_bcast.values()) > 1.3 * alone
    assert busy.dropped > 0  # the learner outruns the installs: records of old versions go stale


def test_a_slow_relay_trails_its_parent_by_its_hold() -> None:
    # as test_a_relay_forwards_a_part_behind_its_parent, the relay holding 1.5 B (its lag at 1 B/s) not 0.5
    net = FlowNet({None: 10.0, 1: 1.0}, {1: 1.0, 2: 1.0}, part=0.5)
    seed = net.add(Flow(1, 1, None, 4.0, 0.0))
    net.add(Flow(1, 2, 1, 4.0, 0.0, upstream=seed, hold=1.5))
    assert finish_times(net) == pytest.approx({(1, 1): 4.0, (1, 2): 5.5})
