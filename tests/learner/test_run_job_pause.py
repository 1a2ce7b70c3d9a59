"""``echo2-learner`` against a real site while its owner pauses, resumes and cancels the job: paused, it
waits past its data timeout instead of failing, still trains (and reports) what is already queued; resumed,
it goes on; cancelled, it stops and says so."""

from __future__ import annotations

import time

import pytest
import redis

from echo2_site.demo import wait_for

from ..live import BIN, api, create_users, start_site
from .test_run_job_resume import push_groups

pytestmark = pytest.mark.slow

R, N = 4, 2


def test_learner_waits_while_paused_and_stops_when_cancelled(stack, tmp_path, tiny_model_dir, redis_url) -> None:
    token = create_users(stack, "own")["own"]
    server = start_site(stack, celery=False)
    owner = api(server, token)
    job = owner.post("jobs/", json={
        "name": "pause", "model_dir": str(tiny_model_dir), "task": {"name": "arithmetic", "max_operand": 4},
        "staleness": 50, "kappa": 2, "batch_trajectories": R, "group_size": N, "max_steps": 50,
        "max_new_tokens": 2,
    }).raise_for_status().json()
    job_url = f"jobs/{job['id']}/"
    owner.post(job_url + "start/").raise_for_status()
    client = redis.Redis.from_url(redis_url)
    learner = stack.start("learner", str(BIN / "echo2-learner"), "--server", server, "--job", str(job["id"]),
                          "--token", token, "--redis", redis_url, "--snapshot-dir", str(tmp_path / "snapshots"),
                          "--data-timeout", "4", "--audit-fraction", "0")  # made-up groups: nothing to audit

    push_groups(client, job["id"], 0, R // N)
    wait_for(lambda: owner.get(job_url).json()["learner_step"] == 1, "the first update", 120)

    # Paused for two data timeouts: the learner waits, the job stays paused (not failed).
    owner.post(job_url + "pause/").raise_for_status()
    time.sleep(9)
    assert learner.poll() is None
    assert owner.get(job_url).json()["status"] == "paused"

    # Groups queued before the pause are still trained and reported while paused.
    push_groups(client, job["id"], R // N, R // N)
    wait_for(lambda: owner.get(job_url).json()["learner_step"] == 2, "an update while paused", 60)
    assert owner.get(job_url).json()["status"] == "paused"

    # Resumed: training goes on.
    owner.post(job_url + "resume/").raise_for_status()
    push_groups(client, job["id"], 2 * R // N, R // N)
    wait_for(lambda: owner.get(job_url).json()["learner_step"] == 3, "an update after resuming", 60)

    # Cancelled: the learner stops on its own, without marking the job failed.
    owner.post(job_url + "cancel/").raise_for_status()
    learner.wait(timeout=60)
    log = (stack.logs / "learner.log").read_text()
    assert learner.returncode == 0, log[-3000:]
    assert "paused: waiting for it to resume" in log
    assert f"job {job['id']}: cancelled" in log
    final = owner.get(job_url).json()
    assert final["status"] == "cancelled" and final["status_reason"] == "cancelled by own"
