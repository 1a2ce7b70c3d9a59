"""The capacity model (paper section 3.3, appendix B): the least pool throughput that keeps the learner busy, the
largest lag a schedule allows, and the feasibility of (S, kappa). Cost-aware activation is ``activation``, the
low-frequency controller ``controller``. Pure: no Django, no I/O, no globals.

Units as in DESIGN.md: throughput ``mu`` in trajectories/s, price ``c`` in USD/h, times in seconds.
Bad inputs raise :class:`ProvisioningInputError` naming the offending field, so an API can turn it into
a field error; the physical dead end ``kappa * T_train <= T_bcast`` raises :class:`InfeasibleError`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .inputs import ProvisioningInputError, ceil_steps, finite, non_negative, positive, require, whole


class InfeasibleError(ValueError):
    """No pool can keep up: ``kappa * T_train <= T_bcast``."""


# ---- capacity model (section 3.3, appendix B) --------------------------------------------------------


def _check_schedule(kappa: int, batch: int, t_train: float, t_bcast: float) -> None:
    whole("kappa", kappa, 1, " (publish a snapshot every kappa steps)")
    whole("batch", batch, 1, " (trajectories per step R)")
    positive("t_train", t_train)
    non_negative("t_bcast", t_bcast)


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
    require(finite(gamma) and gamma >= 1, "gamma", f"the safety factor must be >= 1, got {gamma!r}")
    return gamma * mu_min(kappa=kappa, batch=batch, t_train=t_train, t_bcast=t_bcast)


def overlap_holds(*, kappa: int, batch: int, t_train: float, t_bcast: float, mu_pool: float) -> bool:
    """Eq. (2) for a pool of throughput ``mu_pool``; a relative 1e-9 of slack lets ``mu_min`` itself pass."""
    non_negative("mu_pool", mu_pool)
    try:
        need = mu_min(kappa=kappa, batch=batch, t_train=t_train, t_bcast=t_bcast)
    except InfeasibleError:
        return False
    return mu_pool >= need * (1 - 1e-9)


def default_kappa(staleness: int) -> int:
    """The paper's default publication period ``kappa = S - 1`` (section 4.1); S must be at least 2."""
    whole("staleness", staleness, 2, " (the staleness budget S)")
    return staleness - 1


def delta_max_cons(*, kappa: int, t_train: float, t_bcast: float, batch: int, mu_pool: float) -> int:
    """Conservative worst-case lag, appendix B.2, Eq. (7): ``kappa + ceil((T_bcast + R/mu_pool) / T_train) - 1``.

    Worst case of B.1: nobody generates under a new snapshot before it is fully installed, so the first
    batch of fresh trajectories exists ``T_bcast + R / mu_pool`` seconds after publication.
    """
    _check_schedule(kappa, batch, t_train, t_bcast)
    positive("mu_pool", mu_pool)
    return kappa + ceil_steps((t_bcast + batch / mu_pool) / t_train) - 1


def delta_max_tight(*, kappa: int, t_train: float, t_bcast: float) -> int:
    """Worst-case lag of any pool satisfying Eq. (2), appendix B.3: ``kappa + ceil((1 - 1/kappa) T_bcast/T_train)``.

    Substituting ``R / mu_pool <= T_train - T_bcast / kappa`` into Eq. (7) removes ``mu_pool``. The bound
    is an upper bound of ``delta_max_cons`` for every overlapping pool and equals it at ``mu_min``: it
    is the lag the provisioning rule guarantees however the pool's throughput moves above ``mu_min``.
    """
    _check_schedule(kappa, 1, t_train, t_bcast)
    return kappa + ceil_steps((1 - 1 / kappa) * t_bcast / t_train)


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
    whole("staleness", staleness, 2, " (the staleness budget S)")
    _check_schedule(kappa, batch, t_train, t_bcast)
    require(kappa < staleness, "kappa", f"must be below the staleness budget S = {staleness} "
             f"(the paper's default is kappa = S - 1 = {staleness - 1}), got {kappa}")
    require(finite(gamma) and gamma >= 1, "gamma", f"the safety factor must be >= 1, got {gamma!r}")
    if mu_pool is not None:
        non_negative("mu_pool", mu_pool)
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


__all__ = ["InfeasibleError", "ProvisioningInputError", "FeasibilityReport", "default_kappa", "delta_max_cons",
           "delta_max_tight", "feasibility", "mu_min", "mu_target", "overlap_holds"]
