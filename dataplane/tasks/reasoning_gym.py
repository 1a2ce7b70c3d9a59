"""Procedural reasoning tasks from ``reasoning-gym``: offline, seeded, scored by each dataset's own checker.

``{"name": "reasoning_gym", "dataset": "chain_sum", "size": 500, "seed": 0, "config": {...}}`` builds
``reasoning_gym.create_dataset(dataset, size=size, seed=seed, **config)``: ``size`` entries, each a question, an
oracle answer and metadata, generated in process (no download). The same spec gives the same entries on the
learner and on every worker, so each keeps the index prompt text -> entry that :meth:`reward` needs (a worker
knows only the prompt). A completion is scored with the dataset's own ``score_answer(answer, entry)`` (partial
credit where the dataset gives it: reasoning-gym scores lie in [0, 1]).

The answer is read as the prompt asks (``answer_format``): ``"tags"`` (reasoning-gym's convention, the last
``<answer>...</answer>``, via ``reasoning_gym.utils.extract_answer``) or ``"plain"`` (the whole completion,
stripped: what a tiny model trained from scratch can learn to emit).
"""

from __future__ import annotations

import math
import random
from typing import Any

from .base import Prompt, TaskAdapter, TaskSpecError, register_task

INSTALL = "pip install 'echo2[gym]'"
ANSWER_FORMATS = {
    "tags": "\nGive the final answer as <answer>answer</answer>.",
    "plain": "\nAnswer:",
}
MAX_SIZE = 100_000


def _reasoning_gym():
    try:
        import reasoning_gym
    except ImportError:
        raise TaskSpecError(f"dataset: the reasoning_gym task needs reasoning-gym ({INSTALL})") from None
    return reasoning_gym


def _int(field: str, value: Any, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise TaskSpecError(f"{field}: must be an integer between {low} and {high}")
    return value


@register_task
class ReasoningGymTask(TaskAdapter):
    name = "reasoning_gym"
    reward_range = (0.0, 1.0)  # reasoning-gym's scores: 1 right, partial credit, 0 wrong

    def __init__(self, *, dataset: str = "", size: int = 500, seed: int = 0, config: dict[str, Any] | None = None,
                 answer_format: str = "tags") -> None:
        if not isinstance(dataset, str) or not dataset:
            raise TaskSpecError("dataset: name a reasoning-gym dataset, e.g. \"chain_sum\"")
        self.size = _int("size", size, 1, MAX_SIZE)
        self.seed = _int("seed", seed, 0, 2**63 - 1)
        config = {} if config is None else config
        if not isinstance(config, dict) or any(not isinstance(k, str) for k in config):
            raise TaskSpecError("config: must be an object of the dataset's options")
        if {"size", "seed"} & set(config):
            raise TaskSpecError("config: 'size' and 'seed' are options of the task, not of its config")
        if answer_format not in ANSWER_FORMATS:
            raise TaskSpecError(f"answer_format: one of {', '.join(ANSWER_FORMATS)}, got {answer_format!r}")
        self.dataset, self.config, self.answer_format = dataset, dict(config), answer_format
        self._scorer = self._create()  # the procedural dataset: its entries and its score_answer
        self._entries: dict[str, dict[str, Any]] = {}  # prompt text -> entry; the first entry of a repeated prompt
        for entry in self._entries_of(self._scorer):
            self._entries.setdefault(self.render(entry["question"]), entry)
        self._prompts = list(self._entries)
        self.alphabet = "".join(sorted(set("".join(self._prompts) + "".join(
            str(e["answer"]) for e in self._entries.values()) + "<answer>/ \n")))

    def _create(self):
        gym = _reasoning_gym()
        if self.dataset not in gym.factory.DATASETS:
            known = ", ".join(sorted(gym.factory.DATASETS)[:8])
            raise TaskSpecError(f"dataset: unknown reasoning-gym dataset {self.dataset!r} (e.g. {known}, ...)")
        try:
            return gym.create_dataset(self.dataset, size=self.size, seed=self.seed, **self.config)
        except Exception as err:  # the dataset's own checks: assertions, TypeError for an unknown option, ...
            raise TaskSpecError(f"config: {self.dataset}: {err}") from None

    def _entries_of(self, data) -> list[dict[str, Any]]:
        try:
            return [data[i] for i in range(self.size)]
        except Exception as err:  # options a dataset checks only when it generates
            raise TaskSpecError(f"config: {self.dataset}: {err}") from None

    def spec(self) -> dict[str, Any]:
        return {"name": self.name, "dataset": self.dataset, "size": self.size, "seed": self.seed,
                "config": dict(self.config), "answer_format": self.answer_format}

    def render(self, question: str) -> str:
        """The prompt text of a question: the question and how to state the answer."""
        return f"{question}{ANSWER_FORMATS[self.answer_format]}"

    def sample_prompts(self, rng: random.Random, count: int) -> list[Prompt]:
        return [Prompt(text=rng.choice(self._prompts)) for _ in range(count)]

    def entry(self, prompt: str) -> dict[str, Any] | None:
        """The dataset entry ``prompt`` was made from; None for a prompt this task could not have produced."""
        return self._entries.get(prompt)

    def extract(self, completion: str) -> str | None:
        if self.answer_format == "plain":
            return completion.strip()
        from reasoning_gym.utils import extract_answer

        return extract_answer(completion)

    def reward(self, prompt: str, completion: str) -> float:
        entry = self.entry(prompt)
        if entry is None:
            return 0.0
        try:
            score = float(self._scorer.score_answer(self.extract(completion), entry))
        except Exception:  # a dataset's checker that fails on a malformed answer: that answer scores 0
            return 0.0
        return min(max(score, 0.0), 1.0) if math.isfinite(score) else 0.0
