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
from types import SimpleNamespace


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


def train(spec, task, model_root: Path, *, name: str, steps: int, errors: list | None = None,
          chat_template: str | None = None) -> list[float]:
    """The batch mean reward of each of ``steps`` updates of the job ``spec`` (its ``task`` built and prepared) on a
    fresh tiny model under ``model_root / name``. The owner's reward functions a task scores on the learner are
    scored as the learner does (learner/scoring.py, its pool of processes); ``errors`` gets each step's count of
    records they failed on. ``chat_template``: written into the tiny model's tokenizer (a chat job's)."""
    import torch
    from transformers import AutoModelForCausalLM

    from dataplane.jobs import LossConfig
    from dataplane.packed import pack_records
    from learner.batch import concat
    from learner.scoring import OwnerScoring
    from learner.step import PolicyTrainer
    from learner.tiny import build_tiny_model
    from worker_agent.engines.base import SamplingParams
    from worker_agent.engines.hf import HFEngine
    from worker_agent.rollout import GroupLease, rollout_groups

    model_dir = build_tiny_model(model_root / name, alphabet=task.alphabet, seed=spec.seed)
    if chat_template is not None:
        (model_dir / "chat_template.jinja").write_text(chat_template)
    torch.manual_seed(spec.seed)
    engine = HFEngine(str(model_dir), device="cpu", seed=spec.seed, prompt_format=spec.prompt_format)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    settings = LossConfig().resolved(clip_eps=spec.clip_eps, max_new_tokens=spec.max_new_tokens)
    trainer = PolicyTrainer(model, torch.optim.AdamW(model.parameters(), lr=spec.learning_rate), settings,
                            pad_id=engine.tokenizer.pad_token_id, max_grad_norm=1.0)
    rng, params = random.Random(spec.seed), SamplingParams(max_new_tokens=spec.max_new_tokens)
    rewards = []
    with contextlib.ExitStack() as stack:
        scoring = OwnerScoring.for_job(spec.task, chat=spec.prompt_format, max_steps=steps, processes=1)
        if scoring is not None:
            stack.callback(scoring.close)
        for t in range(steps):
            prompts = task.sample_prompts(rng, spec.batch_trajectories // spec.group_size)
            leases = [GroupLease(f"{t}-{i}", f"{t}-{i}", p.text) for i, p in enumerate(prompts)]
            groups = rollout_groups(engine, task, leases, job_id=1, n=spec.group_size, params=params, version=t)
            read = [SimpleNamespace(entry_id=f"{t}-{i}", packed=pack_records(g.records)) for i, g in enumerate(groups)]
            if scoring is not None:  # as the learner: the owner's functions added before the advantages
                scored = scoring.apply(read, t)
                if errors is not None:
                    errors.append(scored.errors + scored.non_finite)
            rewards.append(trainer.step(concat(g.packed for g in read)).reward_mean)
            engine.load_weights({k: v.detach().clone() for k, v in model.state_dict().items()})  # the next version
    return rewards


def first_and_last(rewards: list[float], window: int, label: str) -> tuple[float, float]:
    """The mean reward of the first and of the last ``window`` updates, printed under ``label``."""
    first, last = statistics.fmean(rewards[:window]), statistics.fmean(rewards[-window:])
    print(f"{label}: mean reward of the first {window} steps {first:.3f}, of the last {window} {last:.3f}",
          file=sys.stderr)
    return first, last
