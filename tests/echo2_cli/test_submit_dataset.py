"""``echo2 job submit`` with a job file naming its data set by a local path: the CLI sends the files' archive
(``POST /api/datasets/``) and the job names its digest; a path that is no data set is one line, exit 2, nothing
sent."""

from __future__ import annotations

import json

import httpx
import pytest

from dataplane.dataset import content

from ..marketplace import factories
from .test_cli import echo2, one_line_error, owner  # noqa: F401 - the fixture

JOB = """
name = "from a data set"
model_dir = "{model_dir}"
batch_trajectories = 16
group_size = 4

[task]
name = "dataset"
reward = "exact_match"

[task.data]
path = "{path}"
format = "jsonl"
"""


@pytest.mark.django_db(transaction=True)
def test_a_local_data_set_is_uploaded_and_the_job_names_its_digest(owner, live_server, settings):  # noqa: F811
    env, token, tmp_path = owner
    settings.ECHO2 = {**settings.ECHO2, "DATASET_DIR": tmp_path / "site-datasets"}
    (tmp_path / "sums.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    model_dir = factories.checkpoint_dir()
    (tmp_path / "data.toml").write_text(JOB.format(model_dir=model_dir, path="sums.jsonl"))

    done = echo2("job", "submit", str(tmp_path / "data.toml"), "--no-start", "--json", env=env)

    assert done.returncode == 0, done.stderr
    digest = content.digest(tmp_path / "sums.jsonl")
    assert json.loads(done.stdout)["task"]["data"]["digest"] == digest
    assert (tmp_path / "site-datasets" / f"{digest}.tar").read_bytes() == content.pack(tmp_path / "sums.jsonl")

    (tmp_path / "bad.toml").write_text(JOB.format(model_dir=model_dir, path="missing.parquet"))
    reason = one_line_error(echo2("job", "submit", str(tmp_path / "bad.toml"), env=env), 2)
    assert reason.startswith(f"{tmp_path / 'bad.toml'}: task.data.path: no file or directory at")
    jobs = httpx.get(f"{live_server.url}/api/jobs/", headers={"Authorization": f"Token {token}"}).json()
    assert jobs["count"] == 1
