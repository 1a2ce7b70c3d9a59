"""The job's evaluation (``JobSpec.eval``, dataplane/evalspec.py): the policy the learner trains, scored on held-out
problems between steps.

The learner generates with its own model (``transformers``' ``generate`` on the module it trains, in eval mode,
without gradients) from the same prompt ids the workers sample from (``dataplane.chat.prompt_ids``), and scores each
answer with the task's own reward. Two figures, as TRL, verl and the paper report them:

- ``pass_at_1``: the share of problems whose one greedy answer scores 1 (the mean reward of greedy answers, for a
  task with partial credit);
- ``mean_at_k``: the mean reward of ``k`` answers per problem sampled at the evaluation's temperature (the paper's
  avg@k).

Every evaluation uses the same problems and the same sampling seed (common random numbers), so two versions'
figures differ by what the policy learned, not by which problems or draws they got; each result carries its
per-problem greedy scores (``correct``), from which a paired test compares two versions (:func:`paired_change`).
It runs on the training thread between two steps and its wall time is reported (``seconds``; the step's ``eval``
part of dataplane/timing.py); the workers keep generating meanwhile. A model sharded with FSDP is not evaluated
(the learner says so once): rank 0 alone cannot run it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import torch

from dataplane.chat import PromptFormat, prompt_ids
from dataplane.evalspec import EvalConfig, paired_change  # noqa: F401  (paired_change: named here too)
from dataplane.tasks import TaskAdapter

log = logging.getLogger("echo2.learner")

BATCH_PROMPTS = 16  # prompts per generate call: bounds the KV cache next to the training state


@dataclass
class Evaluation:
    """One job's evaluation: its settings, its problems as prompt ids, the task that scores the answers."""

    config: EvalConfig
    task: TaskAdapter
    tokenizer: Any
    prompts: list[str]
    ids: list[list[int]]
    max_new_tokens: int
    pad_id: int
    eos_id: int | None
    max_steps: int

    @classmethod
    def for_job(cls, spec: Any, tokenizer: Any) -> Evaluation | None:
        """The evaluation of a job (a ``JobSpec``), None when its ``eval`` is off."""
        config: EvalConfig = spec.eval
        if not config.enabled:
            return None
        task = config.build_task(spec.task)
        task.prepare(allow_user_code=True)  # the learner is the owner's machine (docs/trust.md)
        prompts = config.prompts(task)
        fmt: PromptFormat = spec.prompt_format
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        return cls(config=config, task=task, tokenizer=tokenizer, prompts=prompts,
                   ids=[prompt_ids(tokenizer, p, fmt) for p in prompts],
                   max_new_tokens=config.max_new_tokens or spec.max_new_tokens, pad_id=int(pad),
                   eos_id=tokenizer.eos_token_id, max_steps=spec.max_steps)

    def due(self, version: int) -> bool:
        """Whether the policy at ``version`` is evaluated: the base (0) with ``before``, every ``every``-th update,
        the last update (``max_steps``) with ``after``."""
        c = self.config
        if version == 0:
            return c.before
        return (c.every > 0 and version % c.every == 0) or (c.after and version >= self.max_steps)

    def run(self, module: torch.nn.Module, version: int) -> dict[str, Any]:
        """Score ``module`` (the policy at ``version``); returns the result as the step report carries it."""
        started = time.perf_counter()
        was_training = module.training
        module.eval()
        try:
            with torch.no_grad(), torch.random.fork_rng(devices=_devices(module)):
                torch.manual_seed(self.config.seed)  # the same draws for every version evaluated
                greedy = self._scores(module, samples=1, temperature=None)
                sampled = self._scores(module, samples=self.config.k, temperature=self.config.temperature) \
                    if self.config.k else []
        finally:
            module.train(was_training)
        correct = [row[0] for row in greedy]
        result = {
            "version": version, "split": self.config.split, "problems": len(self.prompts), "k": self.config.k,
            "temperature": self.config.temperature, "pass_at_1": sum(correct) / len(correct),
            "mean_at_k": sum(sum(row) for row in sampled) / (len(sampled) * self.config.k) if sampled else None,
            "seconds": time.perf_counter() - started, "correct": correct,
        }
        sampled_line = f", mean@{self.config.k} {result['mean_at_k']:.3f}" if sampled else ""
        log.info("eval v%d: pass@1 %.3f%s on %d problems (%s) in %.1f s", version, result["pass_at_1"], sampled_line,
                 len(self.prompts), self.config.split or "the job's task", result["seconds"])
        return result

    def _scores(self, module: torch.nn.Module, *, samples: int,
                temperature: float | None) -> list[list[float]]:
        """Per problem, the rewards of ``samples`` answers (greedy when ``temperature`` is None)."""
        out: list[list[float]] = []
        per_call = max(1, BATCH_PROMPTS // samples)
        for start in range(0, len(self.ids), per_call):
            chunk = self.ids[start:start + per_call]
            texts = self._generate(module, chunk, samples=samples, temperature=temperature)
            for i, prompt in enumerate(self.prompts[start:start + per_call]):
                out.append([float(self.task.reward(prompt, text)) for text in texts[i * samples:(i + 1) * samples]])
        return out

    def _generate(self, module: torch.nn.Module, chunk: list[list[int]], *, samples: int,
                  temperature: float | None) -> list[str]:
        from transformers import GenerationConfig

        device = next(module.parameters()).device
        width = max(len(ids) for ids in chunk)
        input_ids = torch.full((len(chunk), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros_like(input_ids)
        for row, ids in enumerate(chunk):  # left padding, as the HF engine does
            input_ids[row, width - len(ids):] = torch.tensor(ids)
            attention[row, width - len(ids):] = 1
        config = GenerationConfig(max_new_tokens=self.max_new_tokens, do_sample=temperature is not None,
                                  temperature=temperature if temperature is not None else 1.0, top_p=1.0,
                                  num_return_sequences=samples, pad_token_id=self.pad_id, eos_token_id=self.eos_id)
        generated = module.generate(input_ids=input_ids.to(device), attention_mask=attention.to(device),
                                    generation_config=config)
        return self.tokenizer.batch_decode(generated[:, width:].tolist(), skip_special_tokens=True)


def _devices(module: torch.nn.Module) -> list[int]:
    device = next(module.parameters()).device
    return [device.index or 0] if device.type == "cuda" else []
