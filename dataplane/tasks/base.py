"""Task adapters: how a workload becomes prompts and rewards (paper appendix F.1).

An adapter (i) builds prompts x, (ii) defines the reward r = R(x, y) that rollout workers compute,
and (iii) says which completion tokens learn. The learner asks it for prompts; every worker holds the
same adapter (built from the job's task spec) to score its own completions.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any


class TaskSpecError(ValueError):
    """A task spec that names an unknown task or carries bad options."""


@dataclass(frozen=True)
class Prompt:
    """One prompt to sample a GRPO group from. ``text`` is all a worker needs to score an answer."""

    text: str


class TaskAdapter(ABC):
    """Base class for task adapters. Subclasses are built from a JSON spec ``{"name": ..., **options}``."""

    name: str = ""
    #: Characters the task's prompts and answers are written in (used to build tiny tokenizers).
    alphabet: str = ""

    @abstractmethod
    def sample_prompts(self, rng: random.Random, count: int) -> list[Prompt]:
        """Draw ``count`` prompts."""

    @abstractmethod
    def reward(self, prompt: str, completion: str) -> float:
        """Score ``completion`` for ``prompt``; malformed answers score 0, never raise."""

    def spec(self) -> dict[str, Any]:
        """The JSON spec that rebuilds this adapter."""
        return {"name": self.name}
