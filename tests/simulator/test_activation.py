"""Initial activation through marketplace.core.provisioning, and the ablations of Table 2."""

from __future__ import annotations

import random

from simulator.activation import provision, select
from simulator.model import MBIT, ControlSpec, LearnerSpec, NetSpec, SimConfig, WorkerSpec

POOL = [WorkerSpec(1, 0.35, 0.28), WorkerSpec(2, 3.06, 0.45), WorkerSpec(3, 0.22, 0.12), WorkerSpec(4, 0.35, 0.28),
        WorkerSpec(5, 0.29, 0.20), WorkerSpec(6, 0.86, 0.30)]


def test_greedy_takes_the_cheapest_unit_cost_first_and_fastest_first_the_fastest() -> None:
    rng = random.Random(0)
    assert select("greedy", POOL, 0.5, rng) == (1, 4)  # rho 1.25 each
    assert select("fastest", POOL, 0.5, rng) == (2, 6)
    assert select("exact", POOL, 0.5, rng) == (1, 4)


def test_random_activation_meets_the_target_and_repeats_for_a_seed() -> None:
    picks = [select("random", POOL, 0.9, random.Random(seed)) for seed in (3, 3, 4)]
    assert picks[0] == picks[1]
    for ids in picks:
        assert sum(w.throughput for w in POOL if w.worker_id in ids) >= 0.9


def test_a_star_broadcast_needs_a_bigger_pool_than_chains() -> None:
    """T_bcast of a star grows with N, so the fixed point of provision() settles on more workers."""
    workers = [WorkerSpec(i, 0.35, 0.28) for i in range(1, 30)]
    learner = LearnerSpec(t_train=1631.2, batch=2048, group=16, staleness=3, kappa=2, snapshot_bytes=16e9)
    chain = SimConfig(workers, learner, NetSpec(b0_bps=600 * MBIT), ControlSpec())
    star = SimConfig(workers, learner, NetSpec(b0_bps=600 * MBIT, strategy="star-limited"), ControlSpec())
    (chain_ids, chain_target, chain_bcast), (star_ids, star_target, star_bcast) = (
        provision(chain, random.Random(0)), provision(star, random.Random(0)))
    assert len(chain_ids) == 9 and chain_bcast < 1300
    assert len(star_ids) > len(chain_ids) and star_bcast > chain_bcast and star_target > chain_target
