"""`echo2-agent run` against a live site (daphne, Celery, Redis), read as its provider reads it: the log says
what the agent is doing at each change (not activated, assigned and waiting for the job's base, released because
the owner paused the job, the site gone and when it reconnects), and an idle agent says it calmly."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from echo2_site.demo import wait_for

from ..live import BIN, api, create_users, start_site

pytestmark = pytest.mark.slow

JOB = {"task": {"name": "arithmetic"}, "staleness": 2, "batch_trajectories": 16, "group_size": 4, "max_new_tokens": 1}


def test_the_agent_says_what_it_does_at_each_change_and_idles_calmly(stack, tmp_path, tiny_model_dir):
    tokens = create_users(stack, "own", "prov")
    server = start_site(stack)
    daphne = next(proc for name, proc in stack.procs if name == "daphne")
    config = tmp_path / "agent.json"
    stack.run(str(BIN / "echo2-agent"), "register", "--server", server, "--token", tokens["prov"], "--name", "rig",
              "--price", "0.3", "--config", str(config))
    stack.start("agent", str(BIN / "echo2-agent"), "run", "--config", str(config), "--threads", "1",
                "--status-every", "2")
    log = stack.logs / "agent.log"

    def lines() -> list[str]:  # "HH:MM:SS agent: message"
        return [line.split(" agent: ", 1)[1] for line in log.read_text().splitlines() if " agent: " in line]

    def said(text: str, timeout: float = 60) -> None:
        wait_for(lambda: any(text in line for line in lines()), repr(text), timeout)

    said("idle: not activated (waiting for the scheduler to pick this machine)")
    before = len(lines())
    time.sleep(5)
    window = lines()[before:]
    assert 1 <= len(window) <= 3, window  # a summary every 2 s, nothing else
    assert all(re.fullmatch(r"idle: not activated \(waiting .*\), for \d+ s", line) for line in window), window

    owner = api(server, tokens["own"])
    job = owner.post("jobs/", json={"name": "status", "model_dir": str(tiny_model_dir), **JOB}).raise_for_status()
    job_id = job.json()["id"]
    owner.post(f"jobs/{job_id}/start/").raise_for_status()  # no learner: the base is never published
    said(f"assigned to job {job_id}")
    said(f"idle: job {job_id}'s base snapshot is not here yet")
    owner.post(f"jobs/{job_id}/pause/").raise_for_status()
    said(f"idle: not activated (released from job {job_id}: job paused)")

    os.killpg(daphne.pid, signal.SIGTERM)  # the site goes away
    daphne.wait(10)
    said("lost")
    wait_for(lambda: len([line for line in lines() if re.search(r"; reconnecting in \d+\.\d s$", line)]) >= 2,
             "two reconnection attempts", 60)
    assert any(line.startswith("cannot reach ws://") for line in lines()), lines()
