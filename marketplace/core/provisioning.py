"""Capacity model, cost-aware activation and the low-frequency scheduler (paper sections 3.3-3.4, 4.3,
appendices B and C.2.1). Pure: no Django, no I/O, no globals; callers pass measurements and the time (the
one clock inside is the MILP solver's time budget).

Units as in DESIGN.md: throughput ``mu`` in trajectories/s, price ``c`` in USD/h, times in seconds.
Bad inputs raise :class:`ProvisioningInputError` naming the offending field, so an API can turn it into
a field error; the physical dead end ``kappa * T_train <= T_bcast`` raises :class:`InfeasibleError`.
"""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

OPTIMALITY_TOLERANCE = 1e-5
"""``exact_min_cost`` calls a set optimal when its cost is within this fraction of the cheapest one: $0.001/h
on a $100/h pool, far below what measured throughputs can tell apart, and what keeps the MILP proofs short."""


class InfeasibleError(ValueError):
    """No pool can keep up: ``kappa * T_train <= T_bcast``."""


class ProvisioningInputError(ValueError):
    """An input that makes no sense; ``field`` names it (``str(err)`` reads ``"<field>: <message>"``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def _require(ok: bool, field: str, message: str) -> None:
    if not ok:
        raise ProvisioningInputError(field, message)


def _finite(value: object) -> bool:
    try:
        return math.isfinite(value)
    except TypeError:  # None, a string, ...
        return False


def _positive(field: str, value: float) -> None:
    _require(_finite(value) and value > 0, field, f"must be a positive number, got {value!r}")


def _non_negative(field: str, value: float) -> None:
    _require(_finite(value) and value >= 0, field, f"must be a number >= 0, got {value!r}")


def _whole(field: str, value: int, low: int, why: str) -> None:
    _require(isinstance(value, numbers.Integral) and value >= low, field, f"must be an integer >= {low}{why}, "
             f"got {value!r}")


def _ceil(x: float) -> int:
    """``ceil`` that forgives float noise: ``1.1 / 0.1 = 11.000000000000002`` counts as 11 steps, not 12."""
    return math.ceil(x - 1e-9)


# ---- capacity model (section 3.3, appendix B) --------------------------------------------------------


def _check_schedule(kappa: int, batch: int, t_train: float, t_bcast: float) -> None:
    _whole("kappa", kappa, 1, " (publish a snapshot every kappa steps)")
    _whole("batch", batch, 1, " (trajectories per step R)")
    _positive("t_train", t_train)
    _non_negative("t_bcast", t_bcast)


def mu_min(*, kappa: int, batch: int, t_train: float, t_bcast: float) -> float:
    """Smallest pool throughput satisfying the overlap condition.

    Eq. (2): the ``kappa * R`` trajectories of one publication period must be produced while the learner
    trains ``kappa`` steps, after the snapshot took ``T_bcast`` to arrive:
    ``kappa * T_train >= T_bcast + kappa * R / mu``, i.e. ``mu >= kappa * R / (kappa * T_train - T_bcast)``.
    """
    _check_schedule(kappa, batch, t_train, t_bcast)
    slack = kappa * t_train - t_bcast
    if slack <= 0:
        raise InfeasibleError(
            f"kappa*T_train = {kappa * t_train:.3g}s <= T_bcast = {t_bcast:.3g}s: no pool keeps the learner busy"
        )
    return kappa * batch / slack


def mu_target(*, kappa: int, batch: int, t_train: float, t_bcast: float, gamma: float) -> float:
    """The provisioning target ``gamma * mu_min`` (section 4.3; the paper uses gamma = 1.1 as redundancy)."""
    _require(_finite(gamma) and gamma >= 1, "gamma", f"the safety factor must be >= 1, got {gamma!r}")
    return gamma * mu_min(kappa=kappa, batch=batch, t_train=t_train, t_bcast=t_bcast)


def overlap_holds(*, kappa: int, batch: int, t_train: float, t_bcast: float, mu_pool: float) -> bool:
    """Eq. (2) for a pool of throughput ``mu_pool``; a relative 1e-9 of slack lets ``mu_min`` itself pass."""
    _non_negative("mu_pool", mu_pool)
    try:
        need = mu_min(kappa=kappa, batch=batch, t_train=t_train, t_bcast=t_bcast)
    except InfeasibleError:
        return False
    return mu_pool >= need * (1 - 1e-9)


def default_kappa(staleness: int) -> int:
    """The paper's default publication period ``kappa = S - 1`` (section 4.1); S must be at least 2."""
    _whole("staleness", staleness, 2, " (the staleness budget S)")
    return staleness - 1


def delta_max_cons(*, kappa: int, t_train: float, t_bcast: float, batch: int, mu_pool: float) -> int:
    """Conservative worst-case lag, appendix B.2, Eq. (7): ``kappa + ceil((T_bcast + R/mu_pool) / T_train) - 1``.

    Worst case of B.1: nobody generates under a new snapshot before it is fully installed, so the first
    batch of fresh trajectories exists ``T_bcast + R / mu_pool`` seconds after publication.
    """
    _check_schedule(kappa, batch, t_train, t_bcast)
    _positive("mu_pool", mu_pool)
    return kappa + _ceil((t_bcast + batch / mu_pool) / t_train) - 1


def delta_max_tight(*, kappa: int, t_train: float, t_bcast: float) -> int:
    """Worst-case lag of any pool satisfying Eq. (2), appendix B.3: ``kappa + ceil((1 - 1/kappa) T_bcast/T_train)``.

    Substituting ``R / mu_pool <= T_train - T_bcast / kappa`` into Eq. (7) removes ``mu_pool``. The bound
    is an upper bound of ``delta_max_cons`` for every overlapping pool and equals it at ``mu_min``: it
    is the lag the provisioning rule guarantees however the pool's throughput moves above ``mu_min``.
    """
    _check_schedule(kappa, 1, t_train, t_bcast)
    return kappa + _ceil((1 - 1 / kappa) * t_bcast / t_train)


@dataclass(frozen=True)
class FeasibilityReport:
    feasible: bool  # a pool provisioned by the rule keeps the learner busy with lag <= S
    reason: str  # one line for a person: what is wrong and what to change, or why all is well
    staleness: int
    kappa: int
    mu_min: float | None  # None when kappa * T_train <= T_bcast
    target: float | None  # gamma * mu_min
    overlap: bool | None  # does the given mu_pool satisfy Eq. (2); None without a pool
    max_lag: int | None  # expected largest lag: tight bound under overlap (or without a pool), else Eq. (7)
    lag_bound: str  # "tight (B.3)", "conservative (B.2)" or "" when there is none
    lag_within_budget: bool | None  # max_lag <= S


def feasibility(*, staleness: int, kappa: int, t_train: float, t_bcast: float, batch: int, gamma: float,
                mu_pool: float | None = None) -> FeasibilityReport:
    """Check a job's configuration ``(S, kappa)`` against measured ``T_train``, ``T_bcast`` (section 3.3, B).

    An inconsistent configuration (S < 2, kappa >= S, gamma < 1, ...) raises ProvisioningInputError: it
    is the owner's mistake. Measurements that leave no way to keep up (``kappa * T_train <= T_bcast``)
    or whose B.3 bound exceeds S give ``feasible=False`` with a reason: they may change with the next
    calibration. With ``mu_pool`` the report also judges that pool: overlap and its lag bound.
    """
    _whole("staleness", staleness, 2, " (the staleness budget S)")
    _check_schedule(kappa, batch, t_train, t_bcast)
    _require(kappa < staleness, "kappa", f"must be below the staleness budget S = {staleness} "
             f"(the paper's default is kappa = S - 1 = {staleness - 1}), got {kappa}")
    _require(_finite(gamma) and gamma >= 1, "gamma", f"the safety factor must be >= 1, got {gamma!r}")
    if mu_pool is not None:
        _non_negative("mu_pool", mu_pool)
    report = FeasibilityReport(feasible=False, reason="", staleness=staleness, kappa=kappa, mu_min=None,
                               target=None, overlap=None if mu_pool is None else False, max_lag=None,
                               lag_bound="", lag_within_budget=None)
    if kappa * t_train <= t_bcast:
        wait = t_bcast - kappa * t_train
        return replace(report, reason=(
            f"no pool can keep up: kappa*T_train = {kappa} x {t_train:.3g} s = {kappa * t_train:.3g} s <= "
            f"T_bcast = {t_bcast:.3g} s. Training still goes on, every worker is used, but the learner waits "
            f"at least {wait:.3g} s of every publication period for the broadcast (a bubble of at least "
            f"{wait / (wait + kappa * t_train):.0%}); to keep it busy, shorten the broadcast or publish less often "
            f"(larger kappa, larger S)"))
    need = mu_min(kappa=kappa, batch=batch, t_train=t_train, t_bcast=t_bcast)
    tight = delta_max_tight(kappa=kappa, t_train=t_train, t_bcast=t_bcast)
    overlap = None if mu_pool is None else mu_pool >= need * (1 - 1e-9)
    if overlap is not False:
        lag, bound = tight, "tight (B.3)"
    elif mu_pool > 0:
        lag, bound = delta_max_cons(kappa=kappa, t_train=t_train, t_bcast=t_bcast, batch=batch, mu_pool=mu_pool), \
            "conservative (B.2)"
    else:
        lag, bound = None, ""
    report = replace(report, feasible=tight <= staleness, mu_min=need, target=gamma * need, overlap=overlap,
                     max_lag=lag, lag_bound=bound, lag_within_budget=None if lag is None else lag <= staleness)
    if tight > staleness:
        why = (f"a pool at mu_min = {need:.3g} traj/s may lag up to {tight} > S = {staleness} steps (B.3); "
               f"lower kappa, raise S or shorten the broadcast")
    elif overlap is False:
        why = (f"ok, but the pool's {mu_pool:.3g} traj/s is below mu_min = {need:.3g}: the learner will idle "
               f"until workers are added" + ("" if lag is None else f"; worst-case lag {lag} steps (B.2)"))
    else:
        why = f"ok: target {gamma * need:.3g} traj/s (gamma x mu_min), worst-case lag {tight} <= S = {staleness}"
    return replace(report, reason=why)


# ---- cost-aware activation (section 3.4) ----------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    worker_id: int
    price_per_hour: float
    throughput: float | None  # mu_i in trajectories/s; None until measured
    availability: float = 1.0  # a_i in [0, 1]: share of the recent window the worker was there (section 4.3)

    @property
    def effective_throughput(self) -> float:
        """``a_i * mu_i``, what the worker adds to ``mu_pool`` (section 3.4); 0 while unmeasured."""
        return (self.throughput or 0.0) * self.availability


def _checked(candidates: Sequence[Candidate], *, need_throughput: bool) -> list[Candidate]:
    seen: set[int] = set()
    for c in candidates:
        wid, price, mu, a = c.worker_id, c.price_per_hour, c.throughput, c.availability
        if wid in seen:
            raise ProvisioningInputError("worker_id", f"worker {wid} appears twice")
        seen.add(wid)
        if not (_finite(price) and price > 0):
            raise ProvisioningInputError("price_per_hour", f"worker {wid} costs {price!r} USD/h; a price must be "
                                                           "positive")
        if mu is None and need_throughput:
            raise ProvisioningInputError("throughput", f"worker {wid} has no measured throughput (run "
                                                       "`echo2-agent bench`)")
        if mu is not None and not (_finite(mu) and mu > 0):
            raise ProvisioningInputError("throughput", f"worker {wid} reports {mu!r} trajectories/s; a throughput "
                                                       "must be positive")
        if not (_finite(a) and 0 <= a <= 1):
            raise ProvisioningInputError("availability", f"worker {wid} has availability {a!r}; it must lie in [0, 1]")
    return list(candidates)


def pool_capacity(candidates: Sequence[Candidate]) -> float:
    """Availability-weighted capacity ``mu_pool = sum_i a_i mu_i`` (section 3.4); unmeasured workers add 0."""
    return math.fsum(c.effective_throughput for c in _checked(candidates, need_throughput=False))


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
    _require(_finite(target), "target", f"must be a finite throughput in trajectories/s, got {target!r}")


def greedy_by_unit_cost(candidates: Sequence[Candidate], target: float) -> Selection:
    """The paper's greedy (section 3.4): sort by ``rho_i = c_i / mu_i``, add until ``sum mu_i >= target``.

    Uses effective throughput ``a_i mu_i``; workers with availability 0 are never taken. A target <= 0
    needs nobody. When the whole pool falls short, all of it is taken and ``shortfall`` says by how much.
    """
    _checked_target(target)
    ranked = _by_unit_cost(_checked(candidates, need_throughput=True))
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
    _positive("time_limit_s", time_limit_s)
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
