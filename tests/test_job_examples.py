"""The job files of examples/jobs/ (docs/tasks.md: one per way in) are valid jobs, and each trains: a tiny
model, built for the task's alphabet, trained in process from the job file's settings (the learner's update,
the agent's rollout), its reward rising."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from dataplane.jobfiles import load_job_file
from dataplane.jobs import parse_job_spec
from dataplane.tasks import build_task
from dataplane.tasks.verifiers_env import ALLOW_USER_CODE
from tests.job_training import first_and_last, one_thread, train
from tests.tiny_chat import tiny_chatml_model

ROOT = Path(__file__).resolve().parents[1]
OURS = ["arithmetic.toml", "reasoning-gym.toml", "verifiers.toml"]  # dataset-parquet.toml: test_job_dataset_example
STEPS, WINDOW = 120, 10  # about 10 s a job on one core
# Written for an instruct model's chat template (ChatML): run below on a tiny stand-in with ChatML's tokens.
NEEDS_CHAT_MODEL = ["poker.toml"]


@pytest.fixture
def example_envs(monkeypatch):
    # As the comments say: run in the repository's root, no PYTHONPATH (examples.envs.echo2_sums imports from there)
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv(ALLOW_USER_CODE, "1")  # the owner's environment runs here, as on the learner


def test_every_example_job_file_is_a_valid_job(example_envs) -> None:
    for path in (ROOT / "examples" / "jobs" / name for name in [*OURS, "dataset-parquet.toml", *NEEDS_CHAT_MODEL]):
        spec = parse_job_spec(load_job_file(path))
        task = build_task(spec.task)
        assert task.sample_prompts(random.Random(0), 2), path.name


@pytest.mark.slow
@pytest.mark.parametrize("job", OURS)
def test_each_job_file_trains_a_tiny_model_its_reward_rising(job, example_envs, tmp_path) -> None:
    pytest.importorskip("transformers")
    spec = parse_job_spec(load_job_file(ROOT / "examples" / "jobs" / job))
    task = build_task(spec.task)
    with one_thread():
        rewards = train(spec, task, tmp_path, name=Path(job).stem, steps=STEPS)
    first, last = first_and_last(rewards, WINDOW, job)
    assert last > first + 0.05 and last > 2 * first, rewards


@pytest.mark.slow
def test_the_poker_job_file_plays_and_trains_on_a_chatml_model(tmp_path) -> None:
    """examples/jobs/poker.toml as its comment says, on a tiny model whose tokenizer has ChatML's tokens and
    template (its real model, SmolLM2, is not in CI): hands played by the agent's rollout replay in the audit,
    each decision point is a ChatML user turn, and the learner's update runs on them."""
    pytest.importorskip("pokerkit")
    import torch
    from transformers import LlamaForCausalLM

    from dataplane.jobs import LossConfig
    from dataplane.packed import pack_records
    from learner.batch import concat
    from learner.step import PolicyTrainer
    from worker_agent.engines.base import SamplingParams
    from worker_agent.engines.hf import HFEngine
    from worker_agent.rollout import GroupLease, rollout_groups

    spec = parse_job_spec(load_job_file(ROOT / "examples" / "jobs" / "poker.toml"))
    task = build_task(spec.task)
    tokenizer = tiny_chatml_model(tmp_path, task.alphabet + spec.prompt_format.system_prompt)
    engine = HFEngine(str(tmp_path), device="cpu", seed=0, prompt_format=spec.prompt_format)
    model = LlamaForCausalLM.from_pretrained(tmp_path)
    trainer = PolicyTrainer(model, torch.optim.AdamW(model.parameters(), lr=spec.learning_rate),
                            LossConfig().resolved(clip_eps=spec.clip_eps, max_new_tokens=spec.max_new_tokens),
                            pad_id=tokenizer.pad_token_id)
    prompts = task.sample_prompts(random.Random(spec.seed), 2)
    leases = [GroupLease(f"l{i}", f"g{i}", p.text) for i, p in enumerate(prompts)]
    groups = rollout_groups(engine, task, leases, job_id=1, n=spec.group_size, version=0,
                            params=SamplingParams(max_new_tokens=spec.max_new_tokens, temperature=spec.temperature))
    records = [r for g in groups for r in g.records]
    assert len(records) == 2 * spec.group_size
    for r in records:
        assert task.reward(r.prompt, r.completion) == r.reward  # the learner's replay of the hand
        assert "<|im_start|>user" in engine.tokenizer.decode(r.completion_ids)  # the environment's turn, in ChatML
        assert r.metadata["decisions"] >= 1
    stats = trainer.step(concat(pack_records(g.records) for g in groups))
    assert stats.reward_mean == pytest.approx(sum(r.reward for r in records) / len(records))
