"""A quiet agent: a real session generating without pause while the learner publishes version after version
says at most one INFO line every 2 s (each install's details at DEBUG, the newest install in the status line); a
worker that joins long after its job's base was published is told the install time since it joined; the status
file the session keeps is what ``echo2-agent status`` prints."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import torch
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from dataplane import messages as m
from worker_agent import cli, status

from .test_session import answering, assign, learner_side, make_session, push, snapshot, submits, until  # noqa: F401

WINDOW_S = 6.0


def test_a_busy_agent_says_at_most_one_line_every_2_s_and_its_status_is_readable(
        tmp_path, learner_side, tiny_model_dir, caplog) -> None:  # noqa: F811 (the imported fixture)
    store, server = learner_side
    base = store.write_base(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)

    def publish(version: int):  # as the learner does: older versions are pruned as new ones come
        with torch.no_grad():
            model.model.norm.weight.add_(0.01)
        return store.write(model, version)
    config = tmp_path / "agent.json"
    status_file = status.status_path(config)

    def info() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.name.startswith("echo2") and r.levelno >= logging.INFO]

    async def lease_every_request(session, socket) -> None:
        answered = 0
        while True:
            requests = submits(socket)
            if len(requests) > answered and session.connection.waiting.get(requests[-1]["id"]):
                n = len(requests)
                lease = m.Lease(job_id=1, timeout=30, leases=[m.LeasedPrompt(lease_id=f"l{n}", group_id=f"g{n}",
                                                                             prompt="1+2=")])
                await push(session, answering(socket, lease))
                answered = n
            await asyncio.sleep(0.01)

    async def scenario() -> None:
        session, socket = make_session(tmp_path, [])
        reporter = asyncio.create_task(status.report(session, every=2.0, poll=0.1, status_file=status_file))
        published_long_ago = snapshot(store, server, base).model_copy(update={"published_at": time.time() - 332})
        await push(session, assign(1, published_long_ago, digest=base.sha256))
        leasing = asyncio.create_task(lease_every_request(session, socket))
        await until(lambda: session.tally.groups >= 2, "groups accepted")

        before = len(info())
        started = time.monotonic()
        for version in range(1, 6):  # a publication a second or so, each installed while generating goes on
            await push(session, snapshot(store, server, publish(version)))
            await asyncio.sleep(WINDOW_S / 5)
        await until(lambda: session.installs.engine_for(1).version == 5, "v5 installed")
        window, seconds = info()[before:], time.monotonic() - started
        assert len(window) <= seconds / status.MIN_GAP_S + 1, [r.getMessage() for r in window]
        assert all(r.module == "status" for r in window), [r.getMessage() for r in window]
        await until(lambda: (status.read_status(status_file)[0]["last_install"] or "").startswith("v5 installed"),
                    "the status file to say v5 is installed", 10)
        for task in (leasing, reporter):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        session._stop_rollout()
        return session.tally.groups

    with caplog.at_level(logging.DEBUG, logger="echo2"):
        groups = asyncio.run(scenario())

    said = [r.getMessage() for r in info()]
    base_line = next(line for line in said if line.startswith("installed snapshot v0 of job 1"))
    took = float(base_line.split("(")[1].split("s ")[0])
    assert "after joining the job" in base_line and took < 300, base_line  # not "332 s after publication"
    details = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert sum(line.startswith("installed snapshot v") for line in details) == 5  # v1..v5: details at DEBUG
    assert groups >= 2

    reply = CliRunner().invoke(cli.app, ["status", "--config", str(config)])
    assert reply.exit_code == 0, reply.output
    assert "job 1, engine at v5" in reply.output and "accepted by the site:" in reply.output
    gone = CliRunner().invoke(cli.app, ["status", "--config", str(tmp_path / "other.json")])
    assert gone.exit_code == 1 and "no status at" in gone.output
