"""The job setting ``eval``: scoring the policy on held-out problems while it trains (TRL's ``eval_strategy``,
verl's ``test_freq``, the paper's held-out AIME avg@k).

The learner runs it (learner/evaluation.py) with its own model between steps: once before the first update (the
base), every ``every`` updates, and after the last. Each run reports ``pass@1`` (one greedy answer per problem) and
``mean@k`` (the mean reward of ``k`` sampled answers per problem at ``temperature``) over the first ``problems``
prompts of the evaluation task: the job's task with its ``split`` option set to ``split`` (``word_problems``'
``"test"``: problems no training prompt holds), or, without a split, prompts drawn from the job's task with the
evaluation's own seed. Off by default (nothing before, after or between).
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .tasks import TaskAdapter, TaskSpecError, build_task


class EvalConfig(BaseModel):
    """When and how the learner scores its policy on held-out problems (``JobSpec.eval``)."""

    model_config = ConfigDict(extra="forbid")

    before: bool = Field(default=False, description="Score the base model before the first update.")
    after: bool = Field(default=False, description="Score the policy after the last update (step max_steps).")
    every: int = Field(default=0, ge=0, le=1_000_000, description="Score the policy every N updates; 0: only "
                       "before and after.")
    split: str | None = Field(
        default=None, min_length=1, max_length=100, description="The value of the task's split option for the "
        "evaluation (word_problems: \"test\", its held-out problems); null: prompts of the job's own task, drawn "
        "with the evaluation's seed (not held out).")
    problems: int = Field(default=50, ge=1, le=10_000, description="Problems scored per evaluation: the first N of "
                          "the split (or N drawn).")
    k: int = Field(default=4, ge=0, le=64, description="Sampled answers per problem for mean@k (pass@1 is one "
                   "greedy answer); 0: none (mean@k not measured, the greedy answers alone).")
    temperature: float = Field(default=1.0, gt=0.0, le=10.0, description="Sampling temperature of the k answers.")
    max_new_tokens: int | None = Field(default=None, ge=1, le=32_768, description="Longest answer, in tokens; "
                                       "default the job's max_new_tokens.")
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="Seed of the sampled answers (and of the "
                      "prompts drawn without a split).")

    @property
    def enabled(self) -> bool:
        return self.before or self.after or self.every > 0

    def task_spec(self, task: dict[str, Any]) -> dict[str, Any]:
        """The evaluation task's spec: the job's ``task`` with its ``split`` option set (when one is named)."""
        return {**task, "split": self.split} if self.split is not None else dict(task)

    def build_task(self, task: dict[str, Any]) -> TaskAdapter:
        """The evaluation task; TaskSpecError (prefixed ``split:`` where the split is at fault) when it cannot be
        built."""
        try:
            return build_task(self.task_spec(task))
        except TaskSpecError as err:
            if self.split is None:
                raise
            raise TaskSpecError(f"split: {self.split!r} is no split of this task ({str(err).removeprefix('task: ')})"
                                ) from None

    def prompts(self, adapter: TaskAdapter) -> list[str]:
        """The prompts an evaluation scores: the first ``problems`` of a task that lists its prompts (a split), else
        ``problems`` drawn with the evaluation's seed."""
        import random

        listed = getattr(adapter, "prompts", None)
        if self.split is not None and isinstance(listed, list) and listed:
            return [str(p) for p in listed[: self.problems]]
        return [p.text for p in adapter.sample_prompts(random.Random(f"eval/{self.seed}"), self.problems)]


def paired_change(before: list[float], after: list[float]) -> dict[str, float]:
    """How two evaluations of the same problems differ: ``gained`` (wrong before, right after), ``lost``, and the
    two-sided exact McNemar (sign test) p-value over the discordant problems: the chance of a split at least this
    uneven if the policy had not changed. Scores are per problem, 1 right, else 0."""
    if len(before) != len(after):
        raise ValueError(f"{len(before)} problems before, {len(after)} after: not the same evaluation")
    gained = sum(1 for b, a in zip(before, after, strict=True) if a >= 0.5 > b)
    lost = sum(1 for b, a in zip(before, after, strict=True) if b >= 0.5 > a)
    n, low = gained + lost, min(gained, lost)
    p = 1.0 if n == 0 else min(1.0, 2 * sum(math.comb(n, i) for i in range(low + 1)) / 2**n)
    return {"gained": gained, "lost": lost, "p_value": p,
            "change": (sum(after) - sum(before)) / max(len(before), 1)}
