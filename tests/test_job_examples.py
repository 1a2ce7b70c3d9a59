"""The job files of examples/jobs/ (docs/tasks.md: one per way in) are valid jobs, and each trains: a tiny
model, built for the task's alphabet, trained in process from the job file's settings (the learner's update,
the agent's rollout), its reward rising."""

from __future__ import annotations

import random
import statistics
import sys
from pathlib import Path

import pytest

from dataplane.jobfiles import load_job_file
from dataplane.jobs import parse_job_spec
from dataplane.tasks import build_task
from dataplane.tasks.verifiers_env import ALLOW_USER_CODE

ROOT = Path(__file__).resolve().parents[1]
OURS = ["arithmetic.toml", "reasoning-gym.toml", "verifiers.toml"]
STEPS, WINDOW = 120, 10  # about 10 s a job on one core


@pytest.fixture
def example_envs(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "examples" / "envs"))
    monkeypatch.setenv(ALLOW_USER_CODE, "1")  # the owner's environment runs here, as on the learner


def test_every_example_job_file_is_a_valid_job(example_envs) -> None:
    for path in (ROOT / "examples" / "jobs" / name for name in OURS):
        spec = parse_job_spec(load_job_file(path))
        task = build_task(spec.task)
        assert task.sample_prompts(random.Random(0), 2), path.name


def train(job: Path, model_root: Path, *, steps: int) -> list[float]:
    """The batch mean reward of each of ``steps`` updates of the job in ``job`` on a fresh tiny model."""
    import torch
    from transformers import AutoModelForCausalLM

    from dataplane.jobs import LossConfig
    from learner.step import PolicyTrainer
    from learner.tiny import build_tiny_model
    from worker_agent.engines.base import SamplingParams
    from worker_agent.engines.hf import HFEngine
    from worker_agent.rollout import GroupLease, rollout_groups

    spec = parse_job_spec(load_job_file(job))
    task = build_task(spec.task)
    model_dir = build_tiny_model(model_root / job.stem, alphabet=task.alphabet, seed=spec.seed)
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


@pytest.mark.slow
@pytest.mark.parametrize("job", OURS)
def test_each_job_file_trains_a_tiny_model_its_reward_rising(job, example_envs, tmp_path) -> None:
    pytest.importorskip("transformers")
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one core: the same numbers on every machine
    try:
        rewards = train(ROOT / "examples" / "jobs" / job, tmp_path, steps=STEPS)
    finally:
        torch.set_num_threads(threads)
    first, last = statistics.fmean(rewards[:WINDOW]), statistics.fmean(rewards[-WINDOW:])
    print(f"{job}: mean reward of the first {WINDOW} steps {first:.3f}, of the last {WINDOW} {last:.3f}",
          file=sys.stderr)
    assert last > first + 0.05 and last > 2 * first, rewards
