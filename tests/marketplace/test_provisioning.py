"""Capacity model (Eq. 2) and the cost-aware greedy activation, with numbers worked out by hand."""

from __future__ import annotations

import pytest

from marketplace.provisioning import Candidate, InfeasibleError, choose_active, mu_min


def test_mu_min_by_hand() -> None:
    # kappa = 2, R = 128, T_train = 3 s, T_bcast = 1 s: mu_min = 2 * 128 / (2 * 3 - 1) = 256 / 5 = 51.2
    assert mu_min(kappa=2, batch=128, t_train=3.0, t_bcast=1.0) == pytest.approx(51.2)
    # kappa = 4, R = 64, T_train = 0.5 s, T_bcast = 0.25 s: 4 * 64 / (2 - 0.25) = 256 / 1.75 = 146.2857...
    assert mu_min(kappa=4, batch=64, t_train=0.5, t_bcast=0.25) == pytest.approx(146.28571428571428)
    # no broadcast cost: kappa cancels, mu_min = R / T_train = 100 / 4 = 25
    assert mu_min(kappa=3, batch=100, t_train=4.0, t_bcast=0.0) == pytest.approx(25.0)


def test_mu_min_satisfies_the_overlap_condition_with_equality() -> None:
    kappa, batch, t_train, t_bcast = 3, 96, 2.0, 1.5
    mu = mu_min(kappa=kappa, batch=batch, t_train=t_train, t_bcast=t_bcast)

    # Eq. 2: kappa * T_train >= T_bcast + kappa * R / mu, tight at mu_min
    assert kappa * t_train == pytest.approx(t_bcast + kappa * batch / mu)


def test_longer_broadcast_needs_more_throughput() -> None:
    slow = mu_min(kappa=2, batch=128, t_train=3.0, t_bcast=4.0)
    fast = mu_min(kappa=2, batch=128, t_train=3.0, t_bcast=1.0)

    assert slow == pytest.approx(128.0)  # 256 / (6 - 4)
    assert slow > fast


@pytest.mark.parametrize(("kappa", "t_train", "t_bcast"), [(2, 3.0, 6.0), (2, 3.0, 7.5), (1, 1.0, 1.0)])
def test_infeasible_when_broadcast_outlasts_kappa_steps(kappa: int, t_train: float, t_bcast: float) -> None:
    with pytest.raises(InfeasibleError, match="no pool keeps the learner busy"):
        mu_min(kappa=kappa, batch=128, t_train=t_train, t_bcast=t_bcast)


# unit costs rho = c / mu: w1 0.5, w3 1.0, w4 1.0, w2 1.5 (ties broken by worker id)
POOL = [
    Candidate(worker_id=2, price_per_hour=3.0, throughput=2.0),
    Candidate(worker_id=4, price_per_hour=10.0, throughput=10.0),
    Candidate(worker_id=1, price_per_hour=1.0, throughput=2.0),
    Candidate(worker_id=3, price_per_hour=0.5, throughput=0.5),
]


@pytest.mark.parametrize(
    ("target", "chosen"),
    [
        (1.0, [1]),  # w1 alone: 2.0 >= 1
        (2.0, [1]),  # exactly covered
        (2.1, [1, 3]),  # 2.0 + 0.5 = 2.5
        (3.0, [1, 3, 4]),  # 2.5 < 3, then w4: 12.5
        (12.5, [1, 3, 4]),
        (13.0, [1, 3, 4, 2]),  # 12.5 + 2 = 14.5
    ],
)
def test_choose_active_takes_the_cheapest_unit_cost_first(target: float, chosen: list[int]) -> None:
    assert choose_active(POOL, target) == chosen


def test_cheap_slow_worker_loses_to_a_pricier_fast_one() -> None:
    # rho: A = 1 / 0.1 = 10 per unit, B = 4 / 4 = 1 per unit: B first even though it costs more per hour
    pool = [Candidate(worker_id=1, price_per_hour=1.0, throughput=0.1),
            Candidate(worker_id=2, price_per_hour=4.0, throughput=4.0)]

    assert choose_active(pool, 3.0) == [2]


def test_whole_pool_when_short_of_the_target() -> None:
    assert sorted(choose_active(POOL, 100.0)) == [1, 2, 3, 4]


def test_whole_pool_without_a_target() -> None:
    assert choose_active(POOL, None) == [2, 4, 1, 3]


@pytest.mark.parametrize("unknown", [None, 0.0])
def test_whole_pool_while_any_throughput_is_unmeasured(unknown: float | None) -> None:
    pool = [*POOL, Candidate(worker_id=5, price_per_hour=100.0, throughput=unknown)]

    assert choose_active(pool, 1.0) == [2, 4, 1, 3, 5]


def test_empty_pool_activates_nobody() -> None:
    assert choose_active([], 5.0) == []
    assert choose_active([], None) == []
