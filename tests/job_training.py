"""A job trained in process from its spec, as the example-job tests do (tests/test_job_examples.py,
tests/test_job_dataset_example.py): a tiny model built for the task's characters, the agent's rollout
(``rollout_groups`` on the HF engine) and the learner's update (``PolicyTrainer``), one version per update."""

from __future__ import annotations

import contextlib
import random
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch on one core meanwhile: the same numbers on every machine."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def train(spec, task, model_root: Path, *, name: str, steps: int) -> list[float]:
    """The batch mean reward of each of ``steps`` updates of the job ``spec`` (its ``task`` built and prepared) on a
    fresh tiny model under ``model_root / name``."""
    import torch
    from transformers import AutoModelForCausalLM

    from dataplane.jobs import LossConfig
    from learner.step import PolicyTrainer
    from learner.tiny import build_tiny_model
    from worker_agent.engines.base import SamplingParams
    from worker_agent.engines.hf import HFEngine
    from worker_agent.rollout import GroupLease, rollout_groups

    model_dir = build_tiny_model(model_root / name, alphabet=task.alphabet, seed=spec.seed)
    torch.manual_seed(spec.seed)
    engine = HFEngine(str(model_dir), device="cpu", seed=spec.seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    settings = LossConfig().resolved(clip_eps=spec.clip_eps, max_new_tokens=spec.max_new_tokens)
    trainer = PolicyTrainer(model, torch.optim.AdamW(model.parameters(), lr=spec.learning_rate), settings,
                            pad_id=engine.tokenizer.pad_token_id, max_grad_norm=1.0)
    rng, params = random.Random(spec.seed), SamplingParams(max_new_tokens=spec.max_new_tokens)
    rewards = []
    for t in range(steps):
        prompts = task.sample_prompts(rng, spec.batch_trajectories // spec.group_size)
        leases = [GroupLease(f"{t}-{i}", f"{t}-{i}", p.text) for i, p in enumerate(prompts)]
        groups = rollout_groups(engine, task, leases, job_id=1, n=spec.group_size, params=params, version=t)
        rewards.append(trainer.step([r for g in groups for r in g.records]).reward_mean)
        engine.load_weights({k: v.detach().clone() for k, v in model.state_dict().items()})  # the next version
    return rewards


def first_and_last(rewards: list[float], window: int, label: str) -> tuple[float, float]:
    """The mean reward of the first and of the last ``window`` updates, printed under ``label``."""
    first, last = statistics.fmean(rewards[:window]), statistics.fmean(rewards[-window:])
    print(f"{label}: mean reward of the first {window} steps {first:.3f}, of the last {window} {last:.3f}",
          file=sys.stderr)
    return first, last
