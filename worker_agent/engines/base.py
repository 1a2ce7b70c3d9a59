"""The generation engine interface every rollout backend implements, and the sampling semantics they share.

Greedy: a temperature below :data:`GREEDY_BELOW` (0 included) samples greedily on every engine, and a greedy
request for ``n`` samples returns one greedy completion ``n`` times (vLLM refuses greedy with ``n > 1``; sampling
the same argmax ``n`` times would only cost more). The threshold is vLLM's: it cannot sample below 0.01 and would
silently raise the temperature to 0.01, so both engines call such a temperature greedy instead of one sampling at
0.01 and the other at the asked temperature. Jobs may ask for any temperature in [0, 10] (``dataplane.jobs``).

Log-probs are always those of the raw policy (temperature 1, no top-p), whatever the sampling settings.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from dataplane.chat import PLAIN, PromptFormat, prompt_ids
from dataplane.lora import LoraSpec

GREEDY_BELOW = 0.01  # temperatures under this sample greedily, on every engine


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 8
    temperature: float = 1.0
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        """Sample the argmax at each step (temperature below :data:`GREEDY_BELOW`)."""
        return self.temperature < GREEDY_BELOW


@dataclass(frozen=True)
class Completion:
    """One sampled continuation with the behaviour policy's per-token log-probs (temperature 1)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    text: str


class Engine(ABC):
    """Loads a checkpoint directory once, samples completions, and installs new weights in place.

    ``prompt_format`` is the job's (the agent sets it when it builds the job's engine): how a prompt's text becomes
    the ids generated from, the same ids the learner checks and trains on (:func:`dataplane.chat.prompt_ids`)."""

    tokenizer: Any
    prompt_format: PromptFormat = PLAIN

    def encode_prompt(self, prompt: str) -> list[int]:
        """The token ids of ``prompt`` under the job's prompt format: the tokenizer's own special tokens, or its
        chat template (never a token added by hand)."""
        return prompt_ids(self.tokenizer, prompt, self.prompt_format)

    @abstractmethod
    def generate(self, prompts: list[str], *, n: int, params: SamplingParams) -> list[list[Completion]]:
        """Sample ``n`` completions for each prompt; returns one list of ``n`` per prompt (greedy: ``n`` copies of
        one completion)."""

    adapter_version: int | None = None
    """The version whose LoRA adapter the engine generates with (None: none, the weights it holds)."""

    def load_adapter(self, tensors: dict, spec: LoraSpec, *, version: int) -> None:
        """Apply ``version``'s LoRA adapter (its tensors under PEFT's saved names, ``spec`` its settings) on the
        installed base, without reloading the base; raises ValueError, and installs nothing, when it does not fit."""
        raise ValueError(f"the {type(self).__name__} cannot apply LoRA adapters")

    @abstractmethod
    def load_weights(self, tensors: dict) -> None:
        """Install a full set of weights (a verified snapshot) without reloading the model; raises ValueError, and
        installs nothing, when the tensors do not name exactly the model's weights."""
