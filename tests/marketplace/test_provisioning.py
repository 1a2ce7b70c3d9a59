"""Capacity model (Eq. 2, appendix B), the greedy and exact activation solvers: numbers worked out by hand,
bad inputs, and properties checked against brute force."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marketplace.core.activation import (
    OPTIMALITY_TOLERANCE,
    Candidate,
    Selection,
    exact_min_cost,
    greedy_by_unit_cost,
    pool_capacity,
)
from marketplace.core.provisioning import (
    InfeasibleError,
    ProvisioningInputError,
    default_kappa,
    delta_max_cons,
    delta_max_tight,
    feasibility,
    mu_min,
    mu_target,
    overlap_holds,
)


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
def test_greedy_takes_the_cheapest_unit_cost_first(target: float, chosen: list[int]) -> None:
    assert greedy_by_unit_cost(POOL, target).worker_ids == tuple(sorted(chosen))


def test_cheap_slow_worker_loses_to_a_pricier_fast_one() -> None:
    # rho: A = 1 / 0.1 = 10 per unit, B = 4 / 4 = 1 per unit: B first even though it costs more per hour
    pool = [Candidate(worker_id=1, price_per_hour=1.0, throughput=0.1),
            Candidate(worker_id=2, price_per_hour=4.0, throughput=4.0)]

    assert greedy_by_unit_cost(pool, 3.0).worker_ids == (2,)


def test_whole_pool_when_short_of_the_target() -> None:
    short = greedy_by_unit_cost(POOL, 100.0)
    assert short.worker_ids == (1, 2, 3, 4) and short.shortfall == pytest.approx(100.0 - 14.5)


def test_empty_pool_activates_nobody() -> None:
    assert greedy_by_unit_cost([], 5.0).worker_ids == ()


# ---- the capacity model by hand (section 3.3, appendix B) ----------------------------------------------
# One running example: kappa = 2, R = 64, T_train = 10 s, T_bcast = 4 s.
#   mu_min = kappa R / (kappa T_train - T_bcast) = 2 * 64 / (20 - 4) = 128 / 16 = 8 traj/s
#   overlap at mu_min: kappa T_train = 20 = T_bcast + kappa R / mu = 4 + 128 / 8 = 4 + 16
#   B.3 tight: kappa + ceil((1 - 1/2) * 4 / 10) = 2 + ceil(0.2) = 3
#   B.2 at mu = 8:   2 + ceil((4 + 64/8) / 10) - 1 = 2 + ceil(1.2) - 1 = 3   (= tight: the bound is met at mu_min)
#   B.2 at mu = 64:  2 + ceil((4 + 1) / 10) - 1    = 2 + ceil(0.5) - 1 = 2
#   B.2 at mu = 3.2: 2 + ceil((4 + 20) / 10) - 1   = 2 + ceil(2.4) - 1 = 4   (no overlap: 3.2 < 8)
RUN = {"kappa": 2, "batch": 64, "t_train": 10.0, "t_bcast": 4.0}


def test_running_example_mu_min_target_and_overlap() -> None:
    assert mu_min(**RUN) == pytest.approx(8.0)
    assert mu_target(**RUN, gamma=1.1) == pytest.approx(8.8)
    assert overlap_holds(**RUN, mu_pool=8.0)
    assert overlap_holds(**RUN, mu_pool=100.0)
    assert not overlap_holds(**RUN, mu_pool=7.99)
    assert not overlap_holds(**RUN, mu_pool=0.0)
    assert not overlap_holds(kappa=2, batch=64, t_train=2.0, t_bcast=4.0, mu_pool=1e9)  # 4 <= 4: no pool


@pytest.mark.parametrize(("mu_pool", "lag"), [(8.0, 3), (64.0, 2), (4.0, 3), (3.2, 4)])
def test_running_example_conservative_bound(mu_pool: float, lag: int) -> None:
    # mu = 4: 2 + ceil((4 + 16) / 10) - 1 = 2 + 2 - 1 = 3 (the ceil of exactly 2.0 is 2)
    assert delta_max_cons(kappa=2, t_train=10.0, t_bcast=4.0, batch=64, mu_pool=mu_pool) == lag


def test_tight_bound_by_hand() -> None:
    assert delta_max_tight(kappa=2, t_train=10.0, t_bcast=4.0) == 3
    assert delta_max_tight(kappa=3, t_train=10.0, t_bcast=20.0) == 5  # 3 + ceil(2/3 * 2) = 3 + ceil(1.33) = 5
    assert delta_max_tight(kappa=1, t_train=10.0, t_bcast=9.0) == 1  # 1 + ceil(0 * 0.9): kappa = 1 never waits
    assert delta_max_tight(kappa=4, t_train=10.0, t_bcast=0.0) == 4  # free broadcast: just the period


def test_bounds_forgive_float_noise() -> None:
    # (1.0 + 1/10) / 0.1 = 11.000000000000002 in floats; it is 11 steps: 2 + 11 - 1 = 12, not 13
    assert delta_max_cons(kappa=2, t_train=0.1, t_bcast=1.0, batch=1, mu_pool=10.0) == 12


def test_default_kappa_is_s_minus_one() -> None:
    assert default_kappa(3) == 2
    assert default_kappa(2) == 1


def test_feasibility_of_the_running_example() -> None:
    report = feasibility(staleness=3, **RUN, gamma=1.1)

    assert report.feasible
    assert (report.mu_min, report.target) == (pytest.approx(8.0), pytest.approx(8.8))
    assert (report.overlap, report.max_lag, report.lag_bound, report.lag_within_budget) == (None, 3, "tight (B.3)",
                                                                                           True)
    assert report.reason.startswith("ok")


def test_feasibility_judges_a_given_pool() -> None:
    enough = feasibility(staleness=3, **RUN, gamma=1.1, mu_pool=64.0)
    short = feasibility(staleness=3, **RUN, gamma=1.1, mu_pool=3.2)

    assert (enough.overlap, enough.max_lag, enough.lag_bound) == (True, 3, "tight (B.3)")
    assert (short.overlap, short.max_lag, short.lag_bound) == (False, 4, "conservative (B.2)")
    assert short.feasible and not short.lag_within_budget  # the configuration works; this pool is too small
    assert "below mu_min = 8" in short.reason


def test_feasibility_when_the_broadcast_outlasts_kappa_steps() -> None:
    # kappa T_train = 2 * 3 = 6 s <= T_bcast = 6 s: nothing can keep up
    report = feasibility(staleness=3, kappa=2, batch=64, t_train=3.0, t_bcast=6.0, gamma=1.1)

    assert not report.feasible
    assert report.mu_min is None and report.target is None and report.max_lag is None
    assert "no pool can keep up" in report.reason and "6 s <= T_bcast = 6 s" in report.reason


def test_feasibility_when_the_lag_bound_exceeds_s() -> None:
    # S = 4, kappa = 3, T_train = 10 s, T_bcast = 20 s: mu_min = 3 * 64 / (30 - 20) = 19.2, tight bound 5 > 4
    report = feasibility(staleness=4, kappa=3, batch=64, t_train=10.0, t_bcast=20.0, gamma=1.1)

    assert not report.feasible
    assert report.mu_min == pytest.approx(19.2)
    assert (report.max_lag, report.lag_within_budget) == (5, False)
    assert "5 > S = 4" in report.reason


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"staleness": 1, "kappa": 1}, "staleness"),
        ({"kappa": 3}, "kappa"),  # kappa >= S = 3
        ({"kappa": 0}, "kappa"),
        ({"t_train": 0.0}, "t_train"),
        ({"t_train": -1.0}, "t_train"),
        ({"t_train": float("nan")}, "t_train"),
        ({"t_bcast": -0.5}, "t_bcast"),
        ({"batch": 0}, "batch"),
        ({"gamma": 0.9}, "gamma"),
        ({"mu_pool": -1.0}, "mu_pool"),
    ],
)
def test_feasibility_names_the_bad_field(changes: dict, field: str) -> None:
    args = {"staleness": 3, **RUN, "gamma": 1.1, **changes}

    with pytest.raises(ProvisioningInputError) as err:
        feasibility(**args)
    assert err.value.field == field
    assert str(err.value).startswith(f"{field}: ")


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: mu_min(kappa=0, batch=64, t_train=1.0, t_bcast=0.0), "kappa"),
        (lambda: mu_min(kappa=2, batch=64, t_train=0.0, t_bcast=0.0), "t_train"),
        (lambda: mu_target(**RUN, gamma=0.5), "gamma"),
        (lambda: default_kappa(1), "staleness"),
        (lambda: delta_max_cons(**RUN, mu_pool=0.0), "mu_pool"),
        (lambda: delta_max_tight(kappa=2, t_train=10.0, t_bcast=-1.0), "t_bcast"),
    ],
)
def test_capacity_model_names_the_bad_field(call: Callable[[], object], field: str) -> None:
    with pytest.raises(ProvisioningInputError) as err:
        call()
    assert err.value.field == field


@given(kappa=st.integers(1, 12), batch=st.integers(1, 4096), t_train=st.floats(0.01, 1e4),
       bcast_share=st.floats(0.0, 0.999), headroom=st.floats(1.0, 1e3))
@settings(max_examples=200, deadline=None)
def test_tight_bound_caps_the_conservative_one_under_overlap(kappa: int, batch: int, t_train: float,
                                                             bcast_share: float, headroom: float) -> None:
    # B.3 is B.2 with R/mu_pool replaced by its largest value under Eq. (2): equal at mu_min, above it beyond
    t_bcast = bcast_share * kappa * t_train
    need = mu_min(kappa=kappa, batch=batch, t_train=t_train, t_bcast=t_bcast)
    tight = delta_max_tight(kappa=kappa, t_train=t_train, t_bcast=t_bcast)
    for mu_pool in (need, need * headroom):
        assert overlap_holds(kappa=kappa, batch=batch, t_train=t_train, t_bcast=t_bcast, mu_pool=mu_pool)
        assert delta_max_cons(kappa=kappa, t_train=t_train, t_bcast=t_bcast, batch=batch, mu_pool=mu_pool) <= tight
    assert delta_max_cons(kappa=kappa, t_train=t_train, t_bcast=t_bcast, batch=batch, mu_pool=need) == tight


# ---- activation: the greedy and the exact solver (section 3.4) ------------------------------------------


def test_pool_capacity_weights_by_availability() -> None:
    pool = [Candidate(1, 1.0, 10.0, availability=0.5), Candidate(2, 1.0, 4.0), Candidate(3, 1.0, None)]

    assert pool_capacity(pool) == pytest.approx(5.0 + 4.0 + 0.0)  # unmeasured workers add nothing yet


def test_greedy_ranks_by_effective_unit_cost() -> None:
    # A: $1, mu 10 at a = 0.5 -> 5 effective, rho 0.2; B: $1.5, mu 10 -> rho 0.15; C never there -> never taken
    pool = [Candidate(1, 1.0, 10.0, 0.5), Candidate(2, 1.5, 10.0), Candidate(3, 0.1, 50.0, 0.0)]

    assert greedy_by_unit_cost(pool, 6.0).worker_ids == (2,)
    both = greedy_by_unit_cost(pool, 12.0)
    assert (both.worker_ids, both.throughput, both.price_per_hour) == ((1, 2), pytest.approx(15.0), pytest.approx(2.5))


def test_exact_beats_the_greedy_on_the_hand_pool() -> None:
    # target 3: greedy takes w1 (2.0), w3 (2.5), w4 (12.5) = $1 + $0.5 + $10 = $11.5.
    # Subsets reaching 3: {4} $10, {1, 2} = 2 + 2 = 4 for $1 + $3 = $4, {1, 2, 3} $4.5, ... -> {1, 2} at $4.
    greedy = greedy_by_unit_cost(POOL, 3.0)
    exact = exact_min_cost(POOL, 3.0)

    assert (greedy.worker_ids, greedy.price_per_hour, greedy.method) == ((1, 3, 4), 11.5, "greedy")
    assert (exact.worker_ids, exact.price_per_hour, exact.throughput) == ((1, 2), 4.0, 4.0)
    assert (exact.method, exact.optimal, exact.shortfall, exact.target) == ("exact", True, 0.0, 3.0)


def test_whole_pool_with_its_shortfall_when_the_target_is_out_of_reach() -> None:
    for select in (greedy_by_unit_cost, exact_min_cost):
        out = select(POOL, 20.0)  # capacity 14.5
        assert out.worker_ids == (1, 2, 3, 4)
        assert out.shortfall == pytest.approx(5.5)
        assert not out.optimal


def test_nothing_needed_for_a_target_of_zero() -> None:
    for select in (greedy_by_unit_cost, exact_min_cost):
        out = select(POOL, 0.0)
        assert (out.worker_ids, out.price_per_hour, out.shortfall, out.optimal) == ((), 0.0, 0.0, True)


def test_exact_falls_back_to_the_greedy_after_local_search_on_time_out() -> None:
    # local search turns the greedy {1, 3, 4} ($11.5) into {4} ($10): w1 and w3 are redundant next to w4;
    # no time is left for the MILP that would find {1, 2} ($4)
    out = exact_min_cost(POOL, 3.0, time_limit_s=1e-9)

    assert (out.worker_ids, out.price_per_hour) == ((4,), 10.0)
    assert (out.method, out.optimal) == ("exact-timeout-greedy", False)
    assert "of the LP bound" in out.note


def test_exact_never_accepts_a_set_that_misses_the_target_within_solver_tolerance() -> None:
    # worker 1 covers the target but for one part in 10^9, which HiGHS's feasibility tolerance lets pass,
    # and is five times cheaper than worker 2, which really covers it: the no-good cut must exclude it
    pool = [Candidate(1, 1.0, 100.0 * (1 - 1e-9)), Candidate(2, 5.0, 100.0)]
    out = exact_min_cost(pool, 100.0)

    assert out.worker_ids == (2,)
    assert out.throughput >= 100.0 and out.optimal


def test_exact_sees_a_contribution_below_the_solvers_resolution() -> None:
    # found by hypothesis: worker 7 adds 4.7e-9 traj/s, exactly what worker 1 lacks; {1, 7} costs $1.5, {1, 4} $2.
    # The residual target after fixing worker 1 is 4.7e-9, rounded to 1e-7 relative: HiGHS must get slack.
    pool = [Candidate(1, 1.0, 2.0), Candidate(4, 1.0, 1.0), Candidate(7, 0.5, 1.0, 4.723504932044102e-09)]
    out = exact_min_cost(pool, 2.000000004723505)

    assert (out.worker_ids, out.price_per_hour, out.optimal) == ((1, 7), 1.5, True)


def test_throughputs_near_the_float_floor_do_not_break_the_bounds() -> None:
    # rho = 0.5 / 1e-310 overflows to inf: no LP bound, the MILP alone decides
    pool = [Candidate(1, 0.5, 1.0, 1e-310), Candidate(2, 0.7, 1.0, 3e-310), Candidate(3, 9.0, 1.0, 4e-310)]
    out = exact_min_cost(pool, 3.5e-310)

    assert (out.worker_ids, out.price_per_hour, out.optimal) == ((1, 2), pytest.approx(1.2), True)


def test_exact_on_a_large_mixed_pool_is_proven_and_no_dearer_than_the_greedy() -> None:
    rng = random.Random(7)
    pool = [Candidate(i, round(rng.choice([0.35, 0.3, 3.06, 2.9]) * rng.uniform(0.85, 1.25), 4),
                      rng.choice([1.0, 0.7, 1.6, 2.6]) * rng.lognormvariate(0, 0.25), rng.uniform(0.8, 1.0))
            for i in range(2000)]
    target = 0.3 * pool_capacity(pool)
    greedy, exact = greedy_by_unit_cost(pool, target), exact_min_cost(pool, target, time_limit_s=10.0)

    assert exact.throughput >= target and greedy.throughput >= target
    assert exact.price_per_hour <= greedy.price_per_hour
    assert exact.optimal, exact.note


@pytest.mark.parametrize(
    ("bad", "field", "message"),
    [
        (Candidate(7, 1.0, None), "throughput", "worker 7 has no measured throughput (run `echo2-agent bench`)"),
        (Candidate(7, 1.0, 0.0), "throughput", "worker 7 reports 0.0 trajectories/s"),
        (Candidate(7, 1.0, -2.0), "throughput", "worker 7 reports -2.0 trajectories/s"),
        (Candidate(7, 0.0, 1.0), "price_per_hour", "worker 7 costs 0.0 USD/h"),
        (Candidate(7, -1.0, 1.0), "price_per_hour", "worker 7 costs -1.0 USD/h"),
        (Candidate(7, float("inf"), 1.0), "price_per_hour", "worker 7 costs inf USD/h"),
        (Candidate(7, 1.0, 1.0, availability=1.5), "availability", "worker 7 has availability 1.5"),
        (Candidate(7, 1.0, 1.0, availability=-0.1), "availability", "worker 7 has availability -0.1"),
        (Candidate(2, 1.0, 1.0), "worker_id", "worker 2 appears twice"),
    ],
)
def test_solvers_name_the_bad_field(bad: Candidate, field: str, message: str) -> None:
    for select in (greedy_by_unit_cost, exact_min_cost):
        with pytest.raises(ProvisioningInputError) as err:
            select([*POOL, bad], 1.0)
        assert (err.value.field, err.value.message[:len(message)]) == (field, message)
    assert str(err.value).startswith(f"{field}: {message}")


def test_solvers_reject_a_target_or_time_limit_that_is_not_a_number() -> None:
    for target in (float("nan"), float("inf"), None):
        with pytest.raises(ProvisioningInputError, match="^target: "):
            greedy_by_unit_cost(POOL, target)
    with pytest.raises(ProvisioningInputError, match="^time_limit_s: "):
        exact_min_cost(POOL, 1.0, time_limit_s=0)
    with pytest.raises(ProvisioningInputError, match="^availability: "):
        pool_capacity([Candidate(1, 1.0, 1.0, availability=2.0)])


# ---- properties against brute force -------------------------------------------------------------------


@st.composite
def pools_and_targets(draw: st.DrawFn, max_size: int = 10) -> tuple[list[Candidate], float]:
    size = draw(st.integers(0, max_size))
    pool = [Candidate(worker_id=i * 3 + 1,
                      price_per_hour=draw(st.one_of(st.floats(0.01, 10.0), st.sampled_from([0.35, 0.3, 2.9, 3.06]))),
                      throughput=draw(st.one_of(st.floats(0.01, 50.0), st.integers(1, 8).map(float))),
                      availability=draw(st.one_of(st.just(1.0), st.floats(0.0, 1.0))))
            for i in range(size)]
    capacity = math.fsum(c.effective_throughput for c in pool)
    subset = draw(st.lists(st.booleans(), min_size=size, max_size=size))
    target = draw(st.one_of(
        st.floats(0.0, 1.2).map(lambda f: f * capacity),  # anywhere up to beyond the pool
        st.just(math.fsum(c.effective_throughput for c, s in zip(pool, subset, strict=True) if s)),  # on a boundary
    ))
    return pool, target


def brute_force_cost(pool: list[Candidate], target: float) -> float | None:
    costs = [math.fsum(c.price_per_hour for c in chosen)
             for r in range(len(pool) + 1) for chosen in itertools.combinations(pool, r)
             if math.fsum(c.effective_throughput for c in chosen) >= target]
    return min(costs) if costs else None


def assert_consistent(out: Selection, pool: list[Candidate], target: float) -> None:
    by_id = {c.worker_id: c for c in pool}
    chosen = [by_id[i] for i in out.worker_ids]
    assert list(out.worker_ids) == sorted(set(out.worker_ids))
    assert out.price_per_hour == math.fsum(c.price_per_hour for c in chosen)
    assert out.throughput == math.fsum(c.effective_throughput for c in chosen)
    if math.fsum(c.effective_throughput for c in pool) >= target:  # the pool can: the target is met
        assert out.throughput >= target and out.shortfall == 0.0
    else:  # it cannot: everyone who adds throughput is taken
        assert set(out.worker_ids) == {c.worker_id for c in pool if c.effective_throughput > 0}
        assert out.shortfall == target - out.throughput > 0


@given(pools_and_targets())
@settings(max_examples=150, deadline=None)
def test_exact_matches_brute_force_and_never_costs_more_than_greedy(case: tuple[list[Candidate], float]) -> None:
    pool, target = case
    greedy, exact = greedy_by_unit_cost(pool, target), exact_min_cost(pool, target, time_limit_s=10.0)

    assert_consistent(greedy, pool, target)
    assert_consistent(exact, pool, target)
    assert exact.price_per_hour <= greedy.price_per_hour
    best = brute_force_cost(pool, target)
    if best is not None:
        assert exact.optimal
        assert best <= exact.price_per_hour <= best * (1 + OPTIMALITY_TOLERANCE)


@given(pools_and_targets(max_size=40))
@settings(max_examples=100, deadline=None)
def test_greedy_is_the_unit_cost_prefix(case: tuple[list[Candidate], float]) -> None:
    pool, target = case
    out = greedy_by_unit_cost(pool, target)
    ranked = sorted((c for c in pool if c.effective_throughput > 0),
                    key=lambda c: (c.price_per_hour / c.effective_throughput, c.worker_id))

    assert_consistent(out, pool, target)
    prefix = ranked[:len(out.worker_ids)]
    assert {c.worker_id for c in prefix} == set(out.worker_ids)
    if prefix and target > 0:  # the shortest such prefix: without its last worker it falls short
        assert math.fsum(c.effective_throughput for c in prefix[:-1]) < target
