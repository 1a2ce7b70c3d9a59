"""The learner command copied from the job page runs as printed against a live site (daphne on a private
redis-server, per-learner Redis users on): in a shell whose home holds the owner's token file, with no edit, the
learner gets its own door to the job's streams and sets up; cancelled, the job's user is deleted and the learner
stops, saying so (docs/trust.md "The learner's door")."""

from __future__ import annotations

import html
import os
import re
import signal
import subprocess

import httpx
import pytest
import redis

from dataplane.learner_acl import learner_username
from echo2_site.demo import wait_for

from .live import BIN, api, create_users, make_stack, start_site
from .private_redis import PrivateRedis

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture
def stack(tmp_path):
    server = PrivateRedis(tmp_path).start()
    stack = make_stack(tmp_path, server.url, ECHO2_LEARNER_REDIS_USERS="true")
    yield stack
    stack.stop()
    server.stop()


def job_page_command(server: str, job_id: int) -> str:
    """Sign in as the owner (the site's own form) and copy the command off the job page."""
    with httpx.Client(base_url=server, timeout=30, follow_redirects=True) as browser:
        form = browser.get("/accounts/login/")
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text).group(1)
        browser.post("/accounts/login/", data={"username": "own", "password": "own-pass", "csrfmiddlewaretoken": csrf},
                     headers={"Referer": server + "/accounts/login/"}).raise_for_status()
        page = browser.get(f"/jobs/{job_id}/").text
    return html.unescape(re.search(r'<code id="learner-command">(.*?)</code>', page).group(1))


def test_the_command_on_the_job_page_runs_as_printed(stack, tmp_path, tiny_model_dir) -> None:
    token = create_users(stack, "own")["own"]
    server = start_site(stack, celery=False)
    owner = api(server, token)
    job = owner.post("jobs/", json={
        "name": "copied", "model_dir": str(tiny_model_dir), "task": {"name": "arithmetic", "max_operand": 4},
        "staleness": 3, "batch_trajectories": 4, "group_size": 2, "max_steps": 5, "max_new_tokens": 2,
    }).raise_for_status().json()
    owner.post(f"jobs/{job['id']}/start/").raise_for_status()
    command = job_page_command(server, job["id"])
    assert "--redis" not in command and "TOKEN" not in command

    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (home / ".echo2-token").write_text(token + "\n")
    (home / ".echo2-token").chmod(0o600)
    env = stack.env | {"HOME": str(home), "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    env.pop("ECHO2_TOKEN", None)
    log = tmp_path / "learner.log"
    with open(log, "wb") as out:
        learner = subprocess.Popen(["bash", "-c", command], cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    try:
        wait_for(lambda: "set up; training" in log.read_text() or learner.poll() is not None, "the learner", 240)
        text = log.read_text()
        assert f"as {learner_username(job['id'])} (its job's keys alone)" in text, text[-3000:]
        site_redis = redis.Redis.from_url(stack.env["REDIS_URL"])
        assert site_redis.acl_getuser(learner_username(job["id"])) is not None

        owner.post(f"jobs/{job['id']}/cancel/").raise_for_status()
        learner.wait(timeout=180)
        assert learner.returncode == 0, log.read_text()[-3000:]
        assert f"job {job['id']}: cancelled" in log.read_text()
        assert site_redis.acl_getuser(learner_username(job["id"])) is None
        site_redis.close()
    finally:
        if learner.poll() is None:
            os.killpg(learner.pid, signal.SIGKILL)
            learner.wait(10)
