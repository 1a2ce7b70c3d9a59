"""Capacity model and cost-aware activation (paper section 3.3-3.4, appendix C.2). Pure: no Django.

Overlap condition (Eq. 2): a pool of throughput ``mu`` keeps the learner busy when
``kappa * T_train >= T_bcast + kappa * R / mu``, i.e. ``mu >= mu_min = kappa*R / (kappa*T_train - T_bcast)``.
The scheduler targets ``gamma * mu_min`` and activates the cheapest throughput first, ordered by unit
cost ``rho_i = c_i / mu_i`` (the paper's greedy).
"""

from __future__ import annotations

from dataclasses import dataclass


class InfeasibleError(ValueError):
    """No pool can keep up: ``kappa * T_train <= T_bcast``."""


@dataclass(frozen=True)
class Candidate:
    worker_id: int
    price_per_hour: float
    throughput: float | None  # mu_i in trajectories/s; None until measured


def mu_min(*, kappa: int, batch: int, t_train: float, t_bcast: float) -> float:
    """Smallest pool throughput satisfying the overlap condition (Eq. 2 solved for mu)."""
    slack = kappa * t_train - t_bcast
    if slack <= 0:
        raise InfeasibleError(
            f"kappa*T_train = {kappa * t_train:.3g}s <= T_bcast = {t_bcast:.3g}s: no pool keeps the learner busy"
        )
    return kappa * batch / slack


def choose_active(candidates: list[Candidate], target: float | None) -> list[int]:
    """Worker ids to activate: the greedy by unit cost until ``sum(mu) >= target``.

    Until every candidate has a measured throughput (or without a target) the whole pool is activated:
    that is the calibration phase, in which each worker's ``mu_i`` gets measured. If even the whole
    pool falls short of the target, all of it is used.
    """
    if target is None or any(c.throughput is None or c.throughput <= 0 for c in candidates):
        return [c.worker_id for c in candidates]
    chosen, total = [], 0.0
    for cand in sorted(candidates, key=lambda c: (c.price_per_hour / c.throughput, c.worker_id)):
        if total >= target:
            break
        chosen.append(cand.worker_id)
        total += cand.throughput
    return chosen
