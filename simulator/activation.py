"""Which workers a job starts with: the provisioning rule of section 3.3-3.4 run through the project's own
cores (marketplace.core.provisioning), plus the ablations of Table 2 (random and fastest-first activation).

``T_bcast`` and the pool depend on each other (a bigger pool means longer chains, or under a star a longer
broadcast), so :func:`provision` iterates: estimate ``T_bcast`` for the current pool, compute the target
``gamma * mu_min``, select, and repeat until the pool stops changing.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from marketplace.core.activation import Candidate, exact_min_cost, greedy_by_unit_cost
from marketplace.core.provisioning import InfeasibleError, mu_target
from marketplace.core.reliability import HORIZON_S, Record, reliability

from .broadcast import install_times, plan_for, t_bcast, uplink
from .model import SimConfig, WorkerSpec

ACTIVATIONS = ("greedy", "exact", "random", "fastest", "fixed")


WEEK_S = 7 * 86_400.0


def reliability_of(w: WorkerSpec, *, absence_s: float, absences: int = 0, run_s: float = 0.0) -> float:
    """``r_i`` (marketplace/core/reliability.py) of a worker whose spells away average ``absence_s``: the record of
    the week before the run, at its availability (connected ``a`` of the week, ``(1 - a) / (a absence_s)`` departures
    per connected second, the rate of :meth:`simulator.faults.Faults.availability`), plus the run's ``absences``."""
    a = w.availability
    connected = WEEK_S * a + run_s * a
    departures = WEEK_S * a * (1 - a) / (a * absence_s) if 0 < a < 1 else 0.0
    record = Record(connected_s=connected, sessions_ended=round(departures) + absences)
    return reliability(record, horizon_s=HORIZON_S).value if a > 0 else 0.0


def candidates(workers: Sequence[WorkerSpec], config: SimConfig | None = None) -> list[Candidate]:
    """The workers as the activation core sees them: ``a_i`` the spec's long-run availability, or 1 (what the site's
    window sees of a present worker, ``availability_seen="window"``); ``r_i`` with ``control.reliability``."""
    control = config.control if config else None
    window = control is not None and control.availability_seen == "window"
    return [Candidate(w.worker_id, w.price_per_hour, w.throughput, 1.0 if window and w.availability > 0 else
                      w.availability, reliability_of(w, absence_s=config.absence_s)
                      if control is not None and control.reliability else 1.0) for w in workers]


def select(method: str, workers: Sequence[WorkerSpec], target: float, rng: random.Random,
           config: SimConfig | None = None) -> tuple[int, ...]:
    """Worker ids meeting ``target`` by ``method``: the paper's greedy on ``rho = c/mu``, the exact MILP,
    or the ablations: a random order, fastest first (each adds workers until ``sum a_i mu_i >= target``)."""
    pool = candidates(workers, config)
    if method == "greedy":
        return greedy_by_unit_cost(pool, target).worker_ids
    if method == "exact":
        return exact_min_cost(pool, target).worker_ids
    if method == "random":
        order = rng.sample(pool, len(pool))
    elif method == "fastest":
        order = sorted(pool, key=lambda c: (-c.effective_throughput, c.worker_id))
    else:
        raise ValueError(f"unknown activation {method!r}; one of {', '.join(ACTIVATIONS)}")
    chosen, total = [], 0.0
    for c in order:
        if total >= target:
            break
        chosen.append(c.worker_id)
        total += c.effective_throughput
    return tuple(sorted(chosen))


def broadcast_estimate(config: SimConfig, ids: Sequence[int]) -> float:
    """``T_bcast`` the model predicts for a pool: the q-quantile of its install times."""
    if config.control.t_bcast_estimate is not None:
        return config.control.t_bcast_estimate
    by_id = {w.worker_id: w for w in config.workers}
    bandwidth = {w: by_id[w].bandwidth_bps for w in ids}
    if not bandwidth:
        return 0.0
    net = config.net
    plan = plan_for(net.strategy, bandwidth, b0_bps=net.b0_bps)
    times = install_times(plan, bandwidth, size=config.learner.snapshot_bytes, chunk=net.chunk_bytes,
                          b0_bps=uplink(net.strategy, net.b0_bps))
    return t_bcast(times, q=net.q or 1 / config.control.gamma)


def target_for(config: SimConfig, t_bcast_s: float) -> float:
    """``gamma * mu_min`` (Eq. 2); infinite when ``kappa T_train <= T_bcast`` (no pool keeps up)."""
    lr = config.learner
    try:
        return mu_target(kappa=lr.kappa, batch=lr.batch, t_train=lr.t_train, t_bcast=t_bcast_s,
                         gamma=config.control.gamma)
    except InfeasibleError:
        return float("inf")


def provision(config: SimConfig, rng: random.Random) -> tuple[tuple[int, ...], float, float]:
    """(initial active ids, target, the T_bcast estimate it assumed). ``fixed`` takes ``fixed_ids`` as is."""
    control = config.control
    if control.activation == "fixed":
        ids = tuple(sorted(control.fixed_ids))
        t_b = broadcast_estimate(config, ids)
        return ids, target_for(config, t_b), t_b
    ids: tuple[int, ...] = ()
    t_b = broadcast_estimate(config, [w.worker_id for w in config.workers[:1]])
    seen, pick_seed = set(), rng.random()  # one random order for every round: the prefix grows with the target
    for _ in range(8):
        target = target_for(config, t_b)
        if target == float("inf"):
            return tuple(w.worker_id for w in config.workers), target, t_b
        pick_rng = random.Random(pick_seed) if control.activation == "random" else rng
        ids = select(control.activation, config.workers, target, pick_rng, config)
        if ids in seen:
            break
        seen.add(ids)
        t_b = broadcast_estimate(config, ids)
    return ids, target_for(config, t_b), t_b
