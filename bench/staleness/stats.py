"""Statistics of the staleness sweep over seeds: percentile-bootstrap intervals, censored updates-to-target, and the
ratio of a cell to the synchronous reference paired by seed. Pure functions over plain lists.

Censoring: a run that never reached the target within its step cap counts **at the cap** (its true time is at least
that), and the fraction of runs that reached it is reported beside. So a mean over a cell with misses is a lower
bound; the median is exact as long as more than half of the runs reached the target (``median_censored`` says when
it is not). The primary statistic is the median for that reason; the mean is reported too.

Intervals: the percentile bootstrap (Efron & Tibshirani 1993, ch. 13): resample the seeds with replacement, recompute
the statistic, take the 2.5% and 97.5% quantiles of ``resamples`` replicates. A ratio to the reference resamples
the *seeds* once for both cells (paired: a seed fixes the initialisation and the prompts, so its two runs share
their luck), over the seeds both cells ran.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

Stat = Callable[[Sequence[float]], float]
RESAMPLES = 10_000
LEVEL = 0.95


def censored(reached: Sequence[int | None], cap: int) -> list[float]:
    """Updates to target per run, a run that never reached it (None) counted at ``cap``."""
    if cap < 1:
        raise ValueError(f"cap: the step cap must be >= 1, got {cap}")
    out = []
    for r in reached:
        if r is not None and not 1 <= r <= cap:
            raise ValueError(f"reached: {r} is outside 1..{cap} (the step cap)")
        out.append(float(cap if r is None else r))
    return out


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile ``q`` in [0, 1] of already sorted values (numpy's default method)."""
    if not sorted_values:
        raise ValueError("quantile of no values")
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def bootstrap_interval(values: Sequence[float], stat: Stat = statistics.fmean, *, resamples: int = RESAMPLES,
                       level: float = LEVEL, seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap ``level`` interval of ``stat`` over ``values`` (resampled with replacement)."""
    if not values:
        raise ValueError("bootstrap of no values")
    _check(resamples, level)
    rng, n = random.Random(seed), len(values)
    replicates = sorted(stat([values[rng.randrange(n)] for _ in range(n)]) for _ in range(resamples))
    return quantile(replicates, (1 - level) / 2), quantile(replicates, (1 + level) / 2)


def paired_ratio(cell: dict[int, float], reference: dict[int, float], stat: Stat = statistics.median, *,
                 resamples: int = RESAMPLES, level: float = LEVEL, seed: int = 0) -> tuple[float, float, float, int]:
    """``stat(cell) / stat(reference)`` over the seeds both hold (``seed -> value``), with its percentile-bootstrap
    interval from resampling those seeds jointly; returns (ratio, low, high, seeds paired)."""
    seeds = sorted(cell.keys() & reference.keys())
    if not seeds:
        raise ValueError("paired ratio: the cell and the reference share no seed")
    _check(resamples, level)
    a, b = [cell[s] for s in seeds], [reference[s] for s in seeds]

    def ratio(idx: Sequence[int]) -> float:
        denominator = stat([b[i] for i in idx])
        if denominator <= 0:
            raise ValueError("paired ratio: the reference statistic is not positive")
        return stat([a[i] for i in idx]) / denominator

    rng, n = random.Random(seed), len(seeds)
    replicates = sorted(ratio([rng.randrange(n) for _ in range(n)]) for _ in range(resamples))
    return (ratio(range(n)), quantile(replicates, (1 - level) / 2), quantile(replicates, (1 + level) / 2), n)


@dataclass(frozen=True)
class CellSummary:
    """One cell (task, S, correction) over its seeds."""

    seeds: int
    reached: int  # runs that reached the target within the cap
    cap: int
    median: float  # updates to target, misses at the cap
    median_ci: tuple[float, float]
    median_censored: bool  # half or more of the runs missed: the median is only a lower bound (>= cap)
    mean: float  # a lower bound when any run missed
    mean_ci: tuple[float, float]
    final: float  # final-policy reward
    final_ci: tuple[float, float]
    mean_lag: float

    @property
    def fraction_reached(self) -> float:
        return self.reached / self.seeds


def summarise_cell(runs: Sequence[dict], *, resamples: int = RESAMPLES) -> CellSummary:
    """Summary of one cell's runs (each a results line: ``reached``, ``steps``, ``final``, ``mean_lag``)."""
    if not runs:
        raise ValueError("summary of a cell with no runs")
    caps = {r["steps"] for r in runs}
    if len(caps) != 1:
        raise ValueError(f"runs of one cell have different step caps {sorted(caps)}: summarise them apart")
    cap = caps.pop()
    times = censored([r["reached"] for r in runs], cap)
    finals = [float(r["final"]) for r in runs]
    reached = sum(r["reached"] is not None for r in runs)
    return CellSummary(
        seeds=len(runs), reached=reached, cap=cap, median=statistics.median(times),
        median_ci=bootstrap_interval(times, statistics.median, resamples=resamples),
        median_censored=2 * reached <= len(runs), mean=statistics.fmean(times),
        mean_ci=bootstrap_interval(times, resamples=resamples), final=statistics.fmean(finals),
        final_ci=bootstrap_interval(finals, resamples=resamples),
        mean_lag=statistics.fmean(float(r["mean_lag"]) for r in runs))


def _check(resamples: int, level: float) -> None:
    if resamples < 1:
        raise ValueError(f"resamples: must be >= 1, got {resamples}")
    if not 0 < level < 1:
        raise ValueError(f"level: must be in (0, 1), got {level}")
