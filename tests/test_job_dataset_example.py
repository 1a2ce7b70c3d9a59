"""examples/jobs/dataset-parquet.toml trains: the job file's parquet data set (named by path, resolved to its digest),
its reward functions in TRL's shape (user code, run here as on the learner), a tiny model built for the data set's
characters, trained in process with the learner's update and the agent's rollout; its reward rises."""

from __future__ import annotations

import random
import statistics
import sys
from pathlib import Path

import pytest

from dataplane.dataset import content
from dataplane.jobfiles import load_job_file
from dataplane.jobs import parse_job_spec
from dataplane.tasks import build_task

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "examples" / "jobs" / "dataset-parquet.toml"
STEPS, WINDOW = 120, 10  # about 15 s on one core


@pytest.fixture
def job(monkeypatch):
    pytest.importorskip("datasets")
    monkeypatch.syspath_prepend(str(ROOT / "examples" / "rewards"))
    spec = parse_job_spec(load_job_file(JOB))
    task = build_task(spec.task)
    task.prepare(allow_user_code=True)  # the owner's reward functions, as the learner runs them
    return spec, task


def test_the_job_file_names_its_data_set_by_content(job) -> None:
    spec, task = job

    digest = spec.task["data"]["digest"]
    assert digest == content.digest(ROOT / "examples" / "data" / "sums.parquet")
    assert "path" not in spec.task["data"]
    assert task.reward("3+4=", "7") == 1.0 and task.reward("3+4=", "8") == 0.0
    assert (ROOT / "examples" / "data" / "sums.parquet").stat().st_size < 50_000


def train(spec, task, model_root: Path, *, steps: int) -> list[float]:
    """The batch mean reward of each of ``steps`` updates on a fresh tiny model."""
    import torch
    from transformers import AutoModelForCausalLM

    from dataplane.jobs import LossConfig
    from learner.step import PolicyTrainer
    from learner.tiny import build_tiny_model
    from worker_agent.engines.base import SamplingParams
    from worker_agent.engines.hf import HFEngine
    from worker_agent.rollout import GroupLease, rollout_groups

    model_dir = build_tiny_model(model_root / "tiny-sums", alphabet=task.alphabet, seed=spec.seed)
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
def test_the_job_trains_a_tiny_model_its_reward_rising(job, tmp_path) -> None:
    pytest.importorskip("transformers")
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one core: the same numbers on every machine
    try:
        rewards = train(*job, tmp_path, steps=STEPS)
    finally:
        torch.set_num_threads(threads)
    first, last = statistics.fmean(rewards[:WINDOW]), statistics.fmean(rewards[-WINDOW:])
    print(f"dataset-parquet: mean reward of the first {WINDOW} steps {first:.3f}, of the last {WINDOW} {last:.3f}",
          file=sys.stderr)
    assert last > first + 0.05 and last > 2 * first, rewards
