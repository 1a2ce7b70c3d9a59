"""The simulated fleet keeps the invariants of DESIGN.md and the capacity model's predictions (section 3.3)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from marketplace.core.provisioning import feasibility
from simulator import metrics
from simulator.fleet import simulate
from simulator.model import MBIT, ControlSpec, Fault, LearnerSpec, NetSpec, SimConfig, WorkerSpec

# A small world: T_train 100 s, R = 64 in groups of 8, kappa 2, a 0.5 GB snapshot (40 s at 100 Mbit/s).
LEARNER = LearnerSpec(t_train=100.0, batch=64, group=8, staleness=3, kappa=2, snapshot_bytes=0.5e9,
                      backlog_groups=10**6)
MU = 0.2


def world(n: int, *, steps: int = 16, generation: str = "pause", **kw) -> SimConfig:
    workers = [WorkerSpec(i, 0.35, MU) for i in range(1, 25)]
    control = ControlSpec(activation="fixed", fixed_ids=tuple(range(1, n + 1)), controller=False)
    return SimConfig(workers, LEARNER, NetSpec(b0_bps=300 * MBIT), control, steps=steps, generation=generation, **kw)


def test_the_learner_never_trains_on_a_record_older_than_s() -> None:
    # Far too many workers that keep generating under old versions: stale records pile up and must be dropped.
    result = simulate(world(20, generation="continue"))
    lags = metrics.staleness_histogram(result)
    assert result.dropped > 0
    assert max(lags) <= LEARNER.staleness == result.trained_max_lag
    assert sum(lags.values()) == len(result.steps) * LEARNER.batch


@pytest.mark.parametrize(("n", "feasible"), [(5, True), (6, True), (3, False), (2, False)])
def test_a_pool_meeting_eq_2_keeps_the_learner_busy_and_one_below_it_does_not(n: int, feasible: bool) -> None:
    t_bcast = 0.5e9 / (100 * MBIT)  # 3 chains of <= 2 at 300 Mbit/s: 40 s plus one chunk
    report = feasibility(staleness=3, kappa=2, t_train=100.0, t_bcast=t_bcast, batch=64, gamma=1.0, mu_pool=n * MU)
    assert report.overlap is feasible
    bubble = metrics.bubble_ratio(simulate(world(n)))
    if feasible:
        assert bubble < 0.02
    else:
        assert bubble > 0.15


def test_the_same_seed_gives_the_same_run_and_another_seed_another() -> None:
    a, b, c = simulate(world(4)), simulate(world(4)), simulate(replace(world(4), seed=1))
    assert metrics.summary(a) == metrics.summary(b)
    assert a.delivered == b.delivered
    assert a.delivered != c.delivered


def test_a_dead_worker_is_released_and_the_controller_activates_a_replacement() -> None:
    config = replace(world(6, steps=14), control=ControlSpec(gamma=1.0, hysteresis_s=60.0),
                     faults=(Fault(at=700.0, kind="drop"),))
    result = simulate(config)
    labels = [label for _, label in result.events]
    assert any(label.startswith("fault: rollout drop") for label in labels)
    assert any("released (silent" in label for label in labels)
    activated = [t for t, label in result.events if "activated" in label]
    assert activated and 700 + 60 <= activated[0] <= 700 + 60 + 2 * 30 + 60
    assert result.active_trace[-1][1] >= result.target


def test_a_dead_forwarder_stalls_its_tail_until_the_chain_is_repaired() -> None:
    base = world(6, steps=12)
    fault = replace(base, faults=(Fault(at=500.0, kind="drop", stage="broadcast"),))
    healthy, broken = simulate(base), simulate(fault)
    repaired = [t for t, label in broken.events if label.startswith("chain repaired")]
    assert repaired
    version, dead = next((v, set(healthy.installs[v]) - set(broken.installs[v])) for v in sorted(broken.installs)
                         if healthy.installs[v] != broken.installs[v])
    late = {w: t - healthy.installs[version][w] for w, t in broken.installs[version].items()
            if t != healthy.installs[version][w]}
    assert len(dead) == 1 and len(late) == 1  # the forwarder, and its one child (chains of two)
    # the child waited for the stall timeout, then fetched all it lacked from the dead relay's parent
    assert list(late.values()) == pytest.approx([base.net.relay_stall_s], abs=1.0)



def test_a_worker_of_availability_one_half_delivers_about_half_as_much() -> None:
    """Absence spells (WorkerSpec.availability): the worker is there about a_i of the time (the worker timeout
    is lifted: a spell longer than it would get the worker released, as the site releases a silent worker)."""
    learner = LearnerSpec(t_train=1.0, batch=64, group=8, staleness=3, kappa=2, snapshot_bytes=1e6,
                          backlog_groups=10**6)
    workers = [WorkerSpec(1, 0.35, 1.0), WorkerSpec(2, 0.35, 1.0, availability=0.5)]
    config = SimConfig(workers, learner, NetSpec(b0_bps=300 * MBIT),
                       ControlSpec(activation="fixed", fixed_ids=(1, 2), controller=False, worker_timeout_s=1e9),
                       steps=150, generation="continue", absence_s=20.0)
    result = simulate(config)
    assert result.end > 100 * config.absence_s  # many spells
    assert 0.35 < result.delivered_by[2] / result.delivered_by[1] < 0.65
