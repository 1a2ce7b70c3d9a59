"""Cost-aware activation (paper section 3.4, appendix C.2): which workers to activate for a throughput target, by
the paper's greedy on unit cost ``rho_i = c_i / (a_i r_i mu_i)`` or exactly (a MILP with HiGHS, within a time budget).
Pure: no Django, no I/O; the one clock inside is the solver's time budget."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from .inputs import ProvisioningInputError, finite, positive, require

OPTIMALITY_TOLERANCE = 1e-5
"""``exact_min_cost`` calls a set optimal when its cost is within this fraction of the cheapest one: $0.001/h
on a $100/h pool, far below what measured throughputs can tell apart, and what keeps the MILP proofs short."""




@dataclass(frozen=True)
class Candidate:
    worker_id: int
    price_per_hour: float
    throughput: float | None  # mu_i in trajectories/s; None until measured
    availability: float = 1.0  # a_i in [0, 1]: share of the recent window the worker was there (section 4.3)
    reliability: float = 1.0  # r_i in [0, 1]: its long-run record (core/reliability.py); ours, not the paper's

    @property
    def effective_throughput(self) -> float:
        """``a_i * r_i * mu_i``, what the worker adds to ``mu_pool`` (section 3.4's ``a_i mu_i``, weighed by the
        long-run reliability the paper does not have); 0 while unmeasured."""
        return (self.throughput or 0.0) * self.availability * self.reliability


def checked_candidates(candidates: Sequence[Candidate], *, need_throughput: bool) -> list[Candidate]:
    seen: set[int] = set()
    for c in candidates:
        wid, price, mu, a = c.worker_id, c.price_per_hour, c.throughput, c.availability
        if wid in seen:
            raise ProvisioningInputError("worker_id", f"worker {wid} appears twice")
        seen.add(wid)
        if not (finite(price) and price > 0):
            raise ProvisioningInputError("price_per_hour", f"worker {wid} costs {price!r} USD/h; a price must be "
                                                           "positive")
        if mu is None and need_throughput:
            raise ProvisioningInputError("throughput", f"worker {wid} has no measured throughput (run "
                                                       "`echo2-agent bench`)")
        if mu is not None and not (finite(mu) and mu > 0):
            raise ProvisioningInputError("throughput", f"worker {wid} reports {mu!r} trajectories/s; a throughput "
                                                       "must be positive")
        if not (finite(a) and 0 <= a <= 1):
            raise ProvisioningInputError("availability", f"worker {wid} has availability {a!r}; it must lie in [0, 1]")
        if not (finite(c.reliability) and 0 <= c.reliability <= 1):
            raise ProvisioningInputError("reliability", f"worker {wid} has reliability {c.reliability!r}; it must lie "
                                                        "in [0, 1]")
    return list(candidates)


def pool_capacity(candidates: Sequence[Candidate]) -> float:
    """Availability-weighted capacity ``mu_pool = sum_i a_i mu_i`` (section 3.4); unmeasured workers add 0."""
    return math.fsum(c.effective_throughput for c in checked_candidates(candidates, need_throughput=False))


@dataclass(frozen=True)
class Selection:
    worker_ids: tuple[int, ...]  # sorted
    price_per_hour: float  # sum of c_i
    throughput: float  # sum of a_i mu_i
    target: float
    method: str  # "exact", "exact-timeout-greedy" or "greedy"
    optimal: bool  # proven cheapest within OPTIMALITY_TOLERANCE
    shortfall: float  # target - throughput when even the whole pool falls short, else 0
    note: str = ""


def _select(chosen: Sequence[Candidate], target: float, method: str, optimal: bool, note: str = "") -> Selection:
    mu = math.fsum(c.effective_throughput for c in chosen)
    return Selection(tuple(sorted(c.worker_id for c in chosen)), math.fsum(c.price_per_hour for c in chosen),
                     mu, target, method, optimal, max(0.0, target - mu), note)


def _by_unit_cost(candidates: Sequence[Candidate]) -> list[Candidate]:
    """Workers that add throughput, cheapest unit cost ``rho_i = c_i / (a_i mu_i)`` first, ties by id."""
    useful = [c for c in candidates if c.effective_throughput > 0]
    return sorted(useful, key=lambda c: (c.price_per_hour / c.effective_throughput, c.worker_id))


def _greedy_cut(mu: np.ndarray, target: float) -> int:
    """How many of ``mu`` (in order) the greedy takes: the shortest prefix whose exact sum reaches target."""
    k = min(int(np.searchsorted(np.cumsum(mu), target)) + 1, mu.size)
    while k < mu.size and math.fsum(mu[:k]) < target:  # the float cumsum rounded up
        k += 1
    while k > 0 and math.fsum(mu[:k - 1]) >= target:  # ... or down
        k -= 1
    return k


def _checked_target(target: float) -> None:
    require(finite(target), "target", f"must be a finite throughput in trajectories/s, got {target!r}")


def greedy_by_unit_cost(candidates: Sequence[Candidate], target: float) -> Selection:
    """The paper's greedy (section 3.4): sort by ``rho_i = c_i / mu_i``, add until ``sum mu_i >= target``.

    Uses effective throughput ``a_i mu_i``; workers with availability 0 are never taken. A target <= 0
    needs nobody. When the whole pool falls short, all of it is taken and ``shortfall`` says by how much.
    """
    _checked_target(target)
    ranked = _by_unit_cost(checked_candidates(candidates, need_throughput=True))
    if target <= 0:
        return _select([], target, "greedy", True)
    k = _greedy_cut(np.array([c.effective_throughput for c in ranked]), target)
    return _select(ranked[:k], target, "greedy", False)


def _local_search(price: np.ndarray, mu: np.ndarray, target: float, chosen: np.ndarray) -> np.ndarray:
    """Cheapen a feasible set: drop workers it does not need (priciest first), then make the best swap
    of one chosen worker for a cheaper unchosen one that keeps the target; repeat until nothing helps."""
    best = chosen.copy()
    for _ in range(64):
        chosen = best.copy()
        surplus = math.fsum(mu[chosen]) - target
        droppable = np.flatnonzero(chosen & (mu <= surplus))
        for i in droppable[np.argsort(-price[droppable], kind="stable")]:
            if mu[i] <= surplus:
                chosen[i], surplus = False, surplus - mu[i]
        out, inside = np.flatnonzero(~chosen), np.flatnonzero(chosen)
        if out.size and inside.size:
            by_mu = out[np.argsort(mu[out], kind="stable")]
            cheapest_from = np.minimum.accumulate(price[by_mu][::-1])[::-1]  # cheapest worker at least this fast
            pos = np.searchsorted(mu[by_mu], mu[inside] - surplus)
            gain = np.where(pos < by_mu.size, price[inside] - cheapest_from[np.minimum(pos, by_mu.size - 1)], 0.0)
            b = int(np.argmax(gain))
            if gain[b] > 1e-12 * price[inside[b]]:
                chosen[inside[b]] = False
                chosen[by_mu[pos[b] + int(np.argmin(price[by_mu[pos[b]:]]))]] = True
        if math.fsum(mu[chosen]) < target or math.fsum(price[chosen]) >= math.fsum(price[best]):
            return best  # rounding broke feasibility, or no progress
        best = chosen
    return best


def exact_min_cost(candidates: Sequence[Candidate], target: float, *, time_limit_s: float = 1.0) -> Selection:
    """Cheapest set meeting the target: ``min sum c_i x_i  s.t.  sum a_i mu_i x_i >= target, x binary``.

    The 0/1 problem of section 3.4 (a min-cost covering knapsack), solved by HiGHS through
    ``scipy.optimize.milp`` after the textbook knapsack reductions that keep it small at 10^4 workers:

    1. the greedy, cheapened by local search, gives a feasible upper bound ``U``;
    2. the LP relaxation, whose dual is the greedy's critical unit cost ``lambda``, gives the lower bound
       ``L = lambda * target + sum_i min(0, c_i - lambda mu_i)``; ``U - L`` within
       ``OPTIMALITY_TOLERANCE`` ends the search;
    3. reduced-cost fixing: a worker whose ``|c_i - lambda mu_i|`` exceeds ``U - L`` keeps its LP value
       in every set cheaper than ``U``. The rest, the "core" of workers whose unit cost is close to
       ``lambda``, goes to the MILP, with throughputs scaled by the residual target and capped at it,
       prices scaled to at most 1, and the cut ``cost <= U``. A core too large to prove (HiGHS ignores
       its time limit while presolving thousands of columns) is first searched in its best-reduced-cost
       part, growing 4x per round; a cheaper set found there lowers ``U`` and shrinks the core.

    HiGHS solves a slight relaxation (cover row loosened by 1e-6, residual rounded) so that its tolerances
    never exclude a set that truly meets the target; each answer is checked in exact arithmetic (``fsum``), a
    near miss is excluded by a no-good cut and the MILP solved again, so the optimum of a relaxation that
    passes the check is the optimum of the problem. Out of time, the cheapest verified set is kept: HiGHS's
    (``"exact"``) or the greedy's (``"exact-timeout-greedy"``), ``optimal=False``, the gap to ``L`` in ``note``.
    """
    positive("time_limit_s", time_limit_s)
    greedy = greedy_by_unit_cost(candidates, target)  # validates
    if target <= 0 or greedy.shortfall > 0:
        return replace(greedy, method="exact", optimal=target <= 0,
                       note="" if target <= 0 else "the whole pool falls short of the target")
    deadline = time.perf_counter() + time_limit_s  # the one clock in this module: the solver's budget
    ranked = _by_unit_cost(candidates)
    price = np.array([c.price_per_hour for c in ranked])
    mu = np.array([c.effective_throughput for c in ranked])
    k = _greedy_cut(mu, target)
    best = _local_search(price, mu, target, np.arange(mu.size) < k)
    reduced, lower = _lp_bound(price, mu, target, k)
    method, size, note = "exact-timeout-greedy", 128, "time limit"
    while True:
        upper = math.fsum(price[best])
        if upper - lower <= OPTIMALITY_TOLERANCE * upper:
            return _pick(ranked, best, target, "exact", True, "within tolerance of the LP bound")
        core = np.flatnonzero(np.abs(reduced) <= upper - lower + 1e-9 * upper)
        take = reduced < 0
        take[core] = False  # in every set cheaper than U
        if math.fsum(mu[take]) >= target or core.size == 0:  # nothing else can vary: fixing decides
            cheaper = math.fsum(mu[take]) >= target and math.fsum(price[take]) < upper
            return _pick(ranked, take if cheaper else best, target, "exact", True, "reduced-cost fixing decides")
        whole = core.size <= size
        part = core if whole else core[np.argsort(np.abs(reduced[core]), kind="stable")[:size]]
        left = deadline - time.perf_counter()
        if left <= 0:
            break
        # a part is only searched for a cheaper set, not proven: a tenth of the time left is plenty
        found, proven, note = _core_milp(price, mu, target, reduced, part, best, left if whole else 0.1 * left)
        if found is not None:
            best, method = found, "exact"
        if whole:
            return _pick(ranked, best, target, "exact" if proven else method, proven, note)
        size *= 4
    gap = (math.fsum(price[best]) - lower) / math.fsum(price[best])
    return _pick(ranked, best, target, method, False, f"{note}; within {gap:.2e} of the LP bound")


def _lp_bound(price: np.ndarray, mu: np.ndarray, target: float, k: int) -> tuple[np.ndarray, float]:
    """Reduced costs ``c_i - lambda mu_i`` at the greedy's critical unit cost ``lambda`` (the LP dual, ``k``
    the greedy's cut) and the LP lower bound ``L``. Throughputs near the float floor (1e-300 traj/s) give
    no bound and no reductions."""
    with np.errstate(all="ignore"):
        lam = price[k - 1] / mu[k - 1]
        reduced = price - lam * mu
        lower = lam * target + math.fsum(reduced[reduced < 0])
    if not math.isfinite(lower):
        return np.zeros_like(price), -math.inf
    return reduced, lower


def _pick(ranked: list[Candidate], chosen: np.ndarray, target: float, method: str, optimal: bool,
          note: str) -> Selection:
    return _select([ranked[i] for i in np.flatnonzero(chosen)], target, method, optimal, note)


def _core_milp(price: np.ndarray, mu: np.ndarray, target: float, reduced: np.ndarray, core: np.ndarray,
               best: np.ndarray, time_limit_s: float) -> tuple[np.ndarray | None, bool, str]:
    """Cheapest set cheaper than ``best`` that varies only ``core`` (the others keep their LP value).

    Returns the set (None if HiGHS found none cheaper), whether that is proven, and HiGHS's message.
    """
    from scipy.optimize import Bounds, LinearConstraint, milp  # the site's dependency, not the agent's

    take = reduced < 0
    take[core] = False
    upper, fixed_cost = math.fsum(price[best]), math.fsum(price[take])
    residual = target - math.fsum(mu[take])
    if residual <= 0 or fixed_cost >= upper:  # the fixed part alone meets the target, or already costs U
        cheaper = math.fsum(mu[take]) >= target and fixed_cost < upper
        return (take if cheaper else None), True, "reduced-cost fixing decides"
    scale = float(price[core].max())
    cost = price[core] / scale
    rows = [np.minimum(mu[core], residual) / residual, cost]  # cover the residual; cost no more than U
    # HiGHS accepts rows violated by ~1e-7 and drops coefficients under 1e-9, and ``residual`` carries the
    # rounding of ``target - fixed``: cover only ``1 - slack`` of it, so that no set truly meeting the
    # target is lost; the near misses this admits are rejected below, in exact arithmetic, one by one
    slack = 1e-6 + 1e-14 * (target / residual + core.size)
    low, high = [1.0 - slack, -np.inf], [np.inf, (upper - fixed_cost) / scale]
    gap = min(1e-2, max(1e-9, OPTIMALITY_TOLERANCE * upper / (upper - fixed_cost)))
    deadline = time.perf_counter() + time_limit_s
    for _ in range(16):
        res = milp(cost, integrality=np.ones(core.size), bounds=Bounds(0, 1),
                   constraints=LinearConstraint(np.array(rows), low, high),
                   options={"time_limit": max(1e-3, deadline - time.perf_counter()), "mip_rel_gap": gap})
        if res.status == 2:  # infeasible: nothing is cheaper than U
            return None, True, f"HiGHS on {core.size} workers: nothing cheaper than greedy + local search"
        message = f"HiGHS on {core.size} workers: {res.message.split(' (')[0]}"
        if res.x is None:
            return None, False, message
        pick = res.x > 0.5
        chosen = take.copy()
        chosen[core[pick]] = True
        if math.fsum(mu[chosen]) >= target:
            return (chosen if math.fsum(price[chosen]) < upper else None), res.status == 0, message
        rows.append(np.where(pick, 1.0, -1.0))  # no-good cut: exclude this near miss, solve again
        low.append(-np.inf)
        high.append(pick.sum() - 1.0)
    return None, False, "HiGHS kept proposing sets just short of the target"
