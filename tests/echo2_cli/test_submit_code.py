"""``echo2 job submit`` with a job file that ships the owner's modules to the workers (``task.code_modules``): the CLI
packs and uploads them and the job names the package by digest; a job running user code on workers and shipping
none gets a warning naming the line to add; the site takes only a package its owner uploaded."""

from __future__ import annotations

import json

import httpx
import pytest

from dataplane import usercode
from dataplane.dataset import content

from ..marketplace import factories
from .test_cli import echo2, owner  # noqa: F401 - the fixture

JOB = """
name = "an environment of my own"
model_dir = "{model_dir}"
batch_trajectories = 16
group_size = 4

[task]
name = "verifiers"
env = "ownpkg_c_env:load_environment"
{code}
"""


@pytest.mark.django_db(transaction=True)
def test_the_modules_are_uploaded_and_the_job_names_their_package(owner, live_server, settings):  # noqa: F811
    env, token, tmp_path = owner
    settings.ECHO2 = {**settings.ECHO2, "DATASET_DIR": tmp_path / "site-datasets"}
    (tmp_path / "ownpkg_c_env.py").write_text("def load_environment():\n    raise RuntimeError('not run here')\n")
    model_dir = factories.checkpoint_dir()
    (tmp_path / "shipped.toml").write_text(JOB.format(model_dir=model_dir, code='code_modules = ["ownpkg_c_env"]'))

    done = echo2("job", "submit", str(tmp_path / "shipped.toml"), "--no-start", "--json", env=env)

    assert done.returncode == 0, done.stderr
    package = tmp_path / "package" / usercode.ARCHIVE
    package.parent.mkdir()
    package.write_bytes(usercode.pack(["ownpkg_c_env"], [tmp_path]))
    digest = content.digest(package)
    job = json.loads(done.stdout)
    assert job["task"]["code"] == digest and "ships none" not in done.stderr
    assert (tmp_path / "site-datasets" / f"{digest}.tar").read_bytes() == content.pack(package)

    (tmp_path / "bare.toml").write_text(JOB.format(model_dir=model_dir, code=""))
    done = echo2("job", "submit", str(tmp_path / "bare.toml"), "--no-start", "--json", env=env)
    assert done.returncode == 0, done.stderr  # created: workers with the module installed may still serve it
    assert 'add task.code_modules = ["ownpkg_c_env"] to ship it' in done.stderr

    raw = {"name": "someone else's code", "model_dir": model_dir, "batch_trajectories": 16, "group_size": 4,
           "task": {"name": "verifiers", "env": "ownpkg_c_env:load_environment", "code": "ab" * 32}}
    refused = httpx.post(f"{live_server.url}/api/jobs/", json=raw, headers={"Authorization": f"Token {token}"})
    assert refused.status_code == 400 and "code: no code package abababababab... was uploaded by you" in refused.text
