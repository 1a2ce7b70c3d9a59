"""Measure this machine's effective rollout throughput mu_i for a model and task (paper 3.2, 4.3).

mu_i counts trajectories per second end to end on this machine: prompt sampling, generation and reward,
the work a worker does per leased group. The network share is left out here and measured live by the
heartbeats once the worker serves a job.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from dataplane.tasks import TaskAdapter

from .engines.base import Engine, SamplingParams


@dataclass(frozen=True)
class BenchResult:
    trajectories: int
    tokens: int
    seconds: float

    @property
    def throughput(self) -> float:
        return self.trajectories / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def measure_throughput(engine: Engine, task: TaskAdapter, *, seconds: float, groups: int, group_size: int,
                       params: SamplingParams, seed: int = 0, warmup: int = 1,
                       on_progress: Callable[[float], None] | None = None) -> BenchResult:
    """Generate batches of ``groups`` prompts x ``group_size`` samples for ``seconds``; count what came out."""
    rng = random.Random(seed)
    for _ in range(warmup):  # first calls pay for lazy initialisation, not throughput
        engine.generate([p.text for p in task.sample_prompts(rng, 1)], n=group_size, params=params)
    trajectories = tokens = 0
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds or trajectories == 0:
        prompts = [p.text for p in task.sample_prompts(rng, groups)]
        for prompt, group in zip(prompts, engine.generate(prompts, n=group_size, params=params), strict=True):
            for completion in group:
                task.reward(prompt, completion.text)
                trajectories += 1
                tokens += len(completion.completion_ids)
        if on_progress is not None:
            on_progress(min(elapsed, seconds))
    return BenchResult(trajectories=trajectories, tokens=tokens, seconds=time.perf_counter() - start)
