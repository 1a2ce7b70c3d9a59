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

ROOT = Path(__file__).resolve().parents[1]
OURS = ["arithmetic.toml", "reasoning-gym.toml", "verifiers.toml"]  # dataset-parquet.toml: test_job_dataset_example
STEPS, WINDOW = 120, 10  # about 10 s a job on one core


@pytest.fixture
def example_envs(monkeypatch):
    # As the comments say: run in the repository's root, no PYTHONPATH (examples.envs.echo2_sums imports from there)
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv(ALLOW_USER_CODE, "1")  # the owner's environment runs here, as on the learner


def test_every_example_job_file_is_a_valid_job(example_envs) -> None:
    for path in (ROOT / "examples" / "jobs" / name for name in [*OURS, "dataset-parquet.toml"]):
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
