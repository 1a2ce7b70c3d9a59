"""examples/jobs/dataset-parquet.toml trains: the job file's parquet data set (named by path, resolved to its digest),
its reward functions in TRL's shape (user code, run here as on the learner), a tiny model built for the data set's
characters, trained in process with the learner's update and the agent's rollout; its reward rises."""

from __future__ import annotations

from pathlib import Path

import pytest

from dataplane.dataset import content
from dataplane.jobfiles import load_job_file
from dataplane.jobs import parse_job_spec
from dataplane.tasks import build_task
from tests.job_training import first_and_last, one_thread, train

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "examples" / "jobs" / "dataset-parquet.toml"
STEPS, WINDOW = 120, 10  # about 15 s on one core


@pytest.fixture
def job(monkeypatch):
    pytest.importorskip("datasets")
    spec = parse_job_spec(load_job_file(JOB))
    task = build_task(spec.task)
    task.prepare(allow_user_code=True)  # the owner's reward functions, as the learner runs them
    return spec, task


def test_the_job_file_names_its_data_set_by_content(job) -> None:
    spec, task = job

    digest = spec.task["data"]["digest"]
    assert digest == content.digest(ROOT / "examples" / "data" / "sums.parquet")
    assert "path" not in spec.task["data"]
    totals, _ = task.owner_scores(["3+4=", "3+4="], ["7", "8"], completion_ids=[[], []], trainer_state=None, chat=None)
    assert totals == [1.0, 0.0], "the owner's function, as the learner scores it"
    assert (ROOT / "examples" / "data" / "sums.parquet").stat().st_size < 50_000


@pytest.mark.slow
def test_the_job_trains_a_tiny_model_its_reward_rising(job, tmp_path) -> None:
    pytest.importorskip("transformers")
    with one_thread():
        rewards = train(*job, tmp_path, name="tiny-sums", steps=STEPS)
    first, last = first_and_last(rewards, WINDOW, "dataset-parquet")
    assert last > first + 0.05 and last > 2 * first, rewards
