"""The learner's reads and top-ups at a distance (simulator/stream.py): what each round trip costs a step."""

from __future__ import annotations

import dataclasses

import pytest

from simulator.fleet import simulate
from simulator.model import MBIT, ControlSpec, LearnerSpec, NetSpec, SimConfig, WorkerSpec


def config(**kw) -> SimConfig:
    workers = [WorkerSpec(w, 0.36, 400.0) for w in (1, 2)]  # a group of 4 in 10 ms: the data path sets the wait
    learner = LearnerSpec(t_train=0.1, batch=16, group=4, staleness=3, kappa=2, snapshot_bytes=1e3)
    return SimConfig(workers, learner, NetSpec(b0_bps=100 * MBIT), ControlSpec(activation="fixed", fixed_ids=(1, 2),
                                                                               controller=False),
                     steps=12, cv=0.0, **kw)


def mean_wait(result) -> float:
    steps = [s for s in result.steps if s.step > 2]
    return sum(s.wait_s for s in steps) / len(steps)


def test_with_no_latencies_a_fast_pool_keeps_the_learner_busy() -> None:
    assert mean_wait(simulate(config())) == pytest.approx(0.0, abs=1e-9)


def test_each_read_of_the_stream_costs_the_learners_round_trip() -> None:
    # two workers each return one group: the learner needs 4, reads twice or more, 50 ms each
    near, far = simulate(config(read_rtt_s=0.0)), simulate(config(read_rtt_s=0.05))
    assert mean_wait(far) >= mean_wait(near) + 0.05


def test_a_freed_slot_is_refilled_only_after_the_top_up_lands() -> None:
    base = config(return_latency_s=0.02)
    quick = simulate(base)
    slow = simulate(dataclasses.replace(base, top_up_latency_s=0.2))
    # the backlog (2 steps' groups) hides one top-up behind the step in training, not 0.2 s of it every step
    assert mean_wait(slow) > mean_wait(quick) + 0.05
    assert [s.step for s in slow.steps] == list(range(1, 13))
