"""What a run of the fleet simulator says, in the paper's terms: bubble ratio, pool throughput, T_bcast,
cost, staleness. Pure functions over a :class:`~simulator.model.SimResult`."""

from __future__ import annotations

import collections
import statistics

from .model import SimResult


def counted(result: SimResult, warmup: int) -> list:
    """The steps after the first ``warmup`` (the pool filling up at the start is not the steady state)."""
    return [s for s in result.steps if s.step > warmup] or result.steps


def bubble_ratio(result: SimResult, warmup: int = 2) -> float:
    """``T_idle / (T_idle + T_train)`` over the counted steps (section 5.1)."""
    steps = counted(result, warmup)
    wait, train = sum(s.wait_s for s in steps), sum(s.t_train for s in steps)
    return wait / (wait + train) if wait + train > 0 else 0.0


def mean_step_bubble(result: SimResult, warmup: int = 2) -> float:
    """Mean of each step's ``wait / (wait + T_train)``: what bench/fault_audit.py reports for the live stack."""
    return statistics.fmean(s.wait_s / (s.wait_s + s.t_train) for s in counted(result, warmup))


def pool_throughput(result: SimResult, warmup: int = 2) -> float:
    """Records returned per second between the first counted step's start and the end of the run."""
    start = counted(result, warmup)[0].start
    records = sum(n for t, _, n in result.delivered if start <= t <= result.end)
    return records / (result.end - start) if result.end > start else 0.0


def staleness_histogram(result: SimResult) -> dict[int, int]:
    """Records trained at each lag (learner version at training minus the version generated under)."""
    hist: collections.Counter[int] = collections.Counter()
    for s in result.steps:
        hist.update(s.lags)
    return dict(sorted(hist.items()))


def cost_per_step(result: SimResult, warmup: int = 2) -> dict[str, float]:
    """USD per learner step in the steady state: the counted steps' mean period times the learner's price,
    and times the pool's mean spend rate (price x active time over the run, per second)."""
    steps = counted(result, warmup)
    period = (result.end - steps[0].start) / len(steps) if result.end > steps[0].start else 0.0
    learner = result.learner_cost / result.end * period if result.end else 0.0
    workers = result.worker_cost / result.end * period if result.end else 0.0
    return {"workers": workers, "learner": learner, "total": workers + learner, "period": period}


def summary(result: SimResult, warmup: int = 2) -> dict:
    """The headline numbers of one run, JSON-ready."""
    bcast = list(result.t_bcast.values())
    steps = counted(result, warmup)
    return {"steps": len(result.steps), "seconds": result.end, "bubble": bubble_ratio(result, warmup),
            "mean_step_bubble": mean_step_bubble(result, warmup), "wait_per_step": statistics.fmean(
                s.wait_s for s in steps), "pool_throughput": pool_throughput(result, warmup),
            "t_bcast_median": statistics.median(bcast) if bcast else None, "dropped": result.dropped,
            "max_lag": result.trained_max_lag, "staleness": staleness_histogram(result),
            "cost": cost_per_step(result, warmup), "initial_workers": len(result.initial_ids), "target": result.target}
