"""A stand-in for a generation engine: no model, a configurable speed, records the site and learner accept.

The agent builds its engine from the job's base checkpoint directory (unpacked from snapshot version 0), so the
stand-in reads that directory's character tokenizer (``learner/tiny.py``: ``tokenizer.json``, one token per
character) to give ids the learner can train on; it installs later versions by accepting any weights.
"""

from __future__ import annotations

import json
import threading
import time
from functools import lru_cache
from pathlib import Path

from worker_agent.engines.base import Completion, Engine, SamplingParams

LOGPROB = -1.5  # per token: plausible for a 20-token vocabulary (uniform would be -3.0); never audited here


@lru_cache(maxsize=8)
def _vocab(model_dir: str) -> tuple[dict[str, int], int]:
    """Character -> id, and the BOS id, of a tiny model's tokenizer (read once per process and directory)."""
    data = json.loads((Path(model_dir) / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    return vocab, vocab.get("<s>", 1)


class GenerationMeter:
    """Groups and tokens the stand-in engines of one process generated (read by the probe's summary)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.groups = 0
        self.tokens = 0

    def add(self, groups: int, tokens: int) -> None:
        with self.lock:
            self.groups += groups
            self.tokens += tokens


METER = GenerationMeter()


class StandInEngine(Engine):
    """``tokens_per_s``: the speed of one agent's GPU; a batch of ``p`` prompts x ``n`` samples x ``k`` tokens
    takes ``p*n*k / tokens_per_s`` seconds (a sleep on the agent's worker thread: no CPU). Every completion is
    ``k`` copies of ``answer`` (a character of the task's alphabet) with log-prob :data:`LOGPROB` per token."""

    def __init__(self, model_dir: str, *, tokens_per_s: float, answer: str = "0") -> None:
        self.vocab, self.bos = _vocab(model_dir)
        self.tokens_per_s = tokens_per_s
        self.answer = answer if answer in self.vocab else next(iter(self.vocab))
        self.version_loads = 0

    def encode_prompt(self, prompt: str) -> list[int]:
        return [self.bos, *(self.vocab.get(ch, 0) for ch in prompt)]

    def generate(self, prompts: list[str], *, n: int, params: SamplingParams) -> list[list[Completion]]:
        k = params.max_new_tokens
        tokens = len(prompts) * n * k
        time.sleep(tokens / self.tokens_per_s)
        METER.add(len(prompts), tokens)
        ids = [self.vocab[self.answer]] * k
        return [[Completion(prompt_ids=self.encode_prompt(p), completion_ids=list(ids), logprobs=[LOGPROB] * k,
                            text=self.answer * k) for _ in range(n)] for p in prompts]

    def load_weights(self, tensors: dict) -> None:
        self.version_loads += 1  # a snapshot's weights: accepted, nothing to load them into
