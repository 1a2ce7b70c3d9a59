"""``echo2 job submit`` says on stderr when no online worker qualifies for the job now: a job shipping its own
reward function to the workers (``scored_on = "worker"``) where no provider opted in; the same function scored on
the learner (the default) qualifies every worker, and nothing is said."""

from __future__ import annotations

import pytest

from marketplace import services

from ..marketplace import factories
from .test_cli import echo2, owner  # noqa: F401 - the fixture

JOB = """
name = "owner reward"
model_dir = "{model_dir}"
batch_trajectories = 16
group_size = 4

[task]
name = "dataset"
reward = [{{ function = "owner_judge:score", scored_on = "{where}" }}]

[task.data]
path = "sums.jsonl"
format = "jsonl"
"""


@pytest.mark.django_db(transaction=True)
def test_submit_says_when_no_worker_runs_the_jobs_code(owner, live_server, settings):  # noqa: F811
    env, _, tmp_path = owner
    settings.ECHO2 = {**settings.ECHO2, "DATASET_DIR": tmp_path / "site-datasets"}
    (tmp_path / "sums.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    worker, _ = factories.worker(factories.user("provider"))
    services.worker_connected(worker=worker, installed_version=None, allow_user_code=False)
    for where in ("worker", "learner"):
        (tmp_path / f"{where}.toml").write_text(JOB.format(model_dir=factories.checkpoint_dir(), where=where))
        done = echo2("job", "submit", str(tmp_path / f"{where}.toml"), "--no-start", env=env)
        assert done.returncode == 0, done.stderr
        if where == "worker":
            assert "no online worker qualifies for this job now: 0 of 1 match (user code 1)" in done.stderr
            assert "echo2-agent run --allow-user-code" in done.stderr
        else:
            assert "qualifies" not in done.stderr, done.stderr
