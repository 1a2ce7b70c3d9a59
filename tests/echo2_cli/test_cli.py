"""``echo2`` as a job owner runs it, against a live site: a job file submitted, followed, paused, resumed and
cancelled; ``--json`` output parsed; a bad key, a refused request and an unreachable site each one line on stderr
and a non-zero exit (2: bad input)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from ..marketplace import factories

ROOT = Path(__file__).resolve().parents[2]

JOB = """
name = "from the cli"
model_dir = "{model_dir}"
batch_trajectories = 16
group_size = 4

[task]
name = "arithmetic"

[loss]
kl_beta = 0.02
"""


def echo2(*args: str, env: dict[str, str] | None = None, input: str | None = None) -> subprocess.CompletedProcess:
    """``python -m echo2_cli`` (what the ``echo2`` console script runs), in a clean environment (no saved login:
    ECHO2_CONFIG names a file that is not there, unless ``env`` says otherwise)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ECHO2_")} | {"PYTHONPATH": str(ROOT)}
    clean["ECHO2_CONFIG"] = "" if env and "XDG_CONFIG_HOME" in env else str(ROOT / "var" / "no-such-echo2-config")
    return subprocess.run([sys.executable, "-m", "echo2_cli", *args], capture_output=True, text=True, timeout=60,
                          env=clean | (env or {}), cwd=ROOT, input=input)


def one_line_error(done: subprocess.CompletedProcess, code: int) -> str:
    assert done.returncode == code, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("echo2: error: "), done.stderr
    return lines[0].removeprefix("echo2: error: ")


@pytest.fixture
def owner(live_server, tmp_path, redis_url, settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    token = factories.token(factories.user("owner"))
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    (tmp_path / "job.toml").write_text(JOB.format(model_dir=factories.checkpoint_dir()))
    env = {"ECHO2_SERVER": live_server.url, "ECHO2_TOKEN_FILE": str(token_file)}
    return env, token, tmp_path


@pytest.mark.django_db(transaction=True)
def test_submit_follow_pause_resume_cancel(owner, live_server):
    env, token, tmp = owner

    submitted = echo2("job", "submit", str(tmp / "job.toml"), "--set", "loss.kl_beta=0.05", "--set", "staleness=4",
                      "--json", env=env)
    assert submitted.returncode == 0, submitted.stderr
    job = json.loads(submitted.stdout)
    assert (job["status"], job["staleness"], job["kappa"], job["loss"]["kl_beta"]) == ("running", 4, 3, 0.05)
    job_id = str(job["id"])
    # The learner reports a step (with the owner's token, as echo2-learner does).
    httpx.post(f"{live_server.url}/api/jobs/{job_id}/metrics/", headers={"Authorization": f"Token {token}"},
               json={"step": 1, "reward_mean": 0.25, "max_staleness": 1, "t_train": 0.5}).raise_for_status()

    status = json.loads(echo2("job", "status", job_id, "--json", env=env).stdout)
    assert (status["summary"]["status"], status["summary"]["step"]) == ("running", 1)
    assert "mean reward" in echo2("job", "status", job_id, env=env).stdout
    logs = [json.loads(line) for line in echo2("job", "logs", job_id, "--json", env=env).stdout.splitlines()]
    assert [(m["step"], m["reward_mean"]) for m in logs] == [(1, 0.25)]
    assert echo2("job", "logs", job_id, env=env).stdout.startswith("step      1  reward 0.2500")

    assert json.loads(echo2("job", "pause", job_id, "--json", env=env).stdout)["status"] == "paused"
    assert echo2("job", "resume", job_id, env=env).stdout.strip() == f"job {job_id} 'from the cli': running"
    cancelled = echo2("job", "cancel", job_id, "--json", env=env)
    assert json.loads(cancelled.stdout)["status"] == "cancelled"

    listed = json.loads(echo2("job", "list", "--json", env=env).stdout)
    assert [(j["id"], j["status"]) for j in listed] == [(job["id"], "cancelled")]
    watched = echo2("job", "watch", job_id, "--json", env=env)  # a finished job: one frame, then it returns
    assert watched.returncode == 0 and json.loads(watched.stdout)["status"] == "cancelled"
    assert "cancelled" in echo2("job", "watch", job_id, env=env).stdout
    refused = one_line_error(echo2("job", "pause", job_id, env=env), 2)  # the site: 400
    assert refused == f"POST /api/jobs/{job_id}/pause/: status: job is cancelled; only a running job can be paused"


@pytest.mark.django_db(transaction=True)
def test_the_downloaded_settings_submit_the_same_job_again(owner):
    env, _, tmp = owner
    first = json.loads(echo2("job", "submit", str(tmp / "job.toml"), "--no-start", "--json", env=env).stdout)
    assert first["status"] == "draft"

    assert echo2("job", "spec", str(first["id"]), "--out", str(tmp / "again.toml"), env=env).returncode == 0
    second = json.loads(echo2("job", "submit", str(tmp / "again.toml"), "--no-start", "--json", env=env).stdout)

    drop = {"id", "created_at"}
    assert {k: v for k, v in second.items() if k not in drop} == {k: v for k, v in first.items() if k not in drop}


@pytest.mark.django_db(transaction=True)
def test_a_bad_key_is_one_line_exit_2_and_nothing_is_created(owner, live_server):
    env, token, tmp = owner
    (tmp / "bad.yaml").write_text(f"name: bad\nmodel_dir: {factories.checkpoint_dir()}\ntask: {{name: arithmetic}}\n"
                                  "stalenes: 4\nloss: {kl_bta: 0.05}\n")

    message = one_line_error(echo2("job", "submit", str(tmp / "bad.yaml"), "--set", "top_p=0", env=env), 2)

    assert message == ("stalenes: unknown key (did you mean staleness?); loss.kl_bta: unknown key (did you mean "
                       "loss.kl_beta?); top_p: Input should be greater than 0")
    jobs = httpx.get(f"{live_server.url}/api/jobs/", headers={"Authorization": f"Token {token}"}).json()
    assert jobs["count"] == 0


@pytest.mark.django_db(transaction=True)
def test_what_the_site_refuses_is_one_line(owner):
    env, _, _ = owner
    assert one_line_error(echo2("job", "status", "999999", env=env), 1) == (
        "GET /api/jobs/999999/: not found (no such job, or not yours)")
    wrong = env | {"ECHO2_TOKEN_FILE": "", "ECHO2_TOKEN": "e2u_wrong"}
    assert one_line_error(echo2("job", "list", env=wrong), 1) == "GET /api/jobs/: Invalid token."


def test_an_unreachable_site_and_a_missing_token_are_one_line(tmp_path):
    unreachable = echo2("job", "list", "--server", "http://127.0.0.1:9", env={"ECHO2_TOKEN": "t"})
    assert one_line_error(unreachable, 1).startswith("cannot reach the site at http://127.0.0.1:9 (")
    assert one_line_error(echo2("job", "list"), 1) == (
        "no API token: run `echo2 login`, give --token-file PATH (or ECHO2_TOKEN_FILE), or set ECHO2_TOKEN")
    (tmp_path / "job.json").write_text("{}")
    assert "a job file is .toml, .yaml or .yml" in one_line_error(echo2("job", "submit", str(tmp_path / "job.json")), 2)
