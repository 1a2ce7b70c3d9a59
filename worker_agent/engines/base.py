"""The generation engine interface every rollout backend implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 8
    temperature: float = 1.0
    top_p: float = 1.0


@dataclass(frozen=True)
class Completion:
    """One sampled continuation with the behaviour policy's per-token log-probs (temperature 1)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    text: str


class Engine(ABC):
    """Loads a checkpoint directory once, samples completions, and installs new weights in place."""

    @abstractmethod
    def generate(self, prompts: list[str], *, n: int, params: SamplingParams) -> list[list[Completion]]:
        """Sample ``n`` completions for each prompt; returns one list of ``n`` per prompt."""

    @abstractmethod
    def load_weights(self, tensors: dict) -> None:
        """Install a full set of weights (a verified snapshot) without reloading the model."""
