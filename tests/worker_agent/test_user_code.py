"""User reward code on a worker (docs/trust.md, "User code on workers"): without the provider's opt-in a job whose task
names a user function is refused with a clear reason, no crash and no restart; with it, the function runs, and what it
does wrong scores 0 and goes to the site counted, with the group it happened in."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import sys
import time

import pytest

from dataplane import messages as m
from dataplane.rewards import build_reward, parse_reward_spec
from dataplane.tasks import TaskAdapter, register_task
from dataplane.tasks.base import TASKS, Prompt
from worker_agent import status
from worker_agent.cli import _opt_in
from worker_agent.config import AgentConfig

from .test_session import (
    RecordingSocket,
    answer_each,
    answering,
    assign,
    learner_side,
    make_session,
    push,
    returned,
    snapshot,
    submits,
    until,
)

__all__ = ["learner_side"]  # the fixture, shared with test_session

OWNER_MODULE = '''
def stubborn(prompts, completions, answer, **kwargs):
    raise RuntimeError("the judge is down")
'''


@pytest.fixture
def rewarded_task(tmp_path, monkeypatch):
    """A task scored by a reward spec (as the ``dataset`` task is), and an owner's module whose function raises."""
    (tmp_path / "owner_judge.py").write_text(OWNER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))

    @register_task
    class Sums(TaskAdapter):
        name = "sums-rewarded"
        alphabet = "0123456789+="
        reward_range = (0.0, 1.0)

        def __init__(self, *, reward: object = "exact_match") -> None:
            self.reward_spec = parse_reward_spec(reward)
            self._reward = None

        def spec(self) -> dict:
            return {"name": self.name, "reward": self.reward_spec.model_dump()}

        def prepare(self, *, allow_user_code: bool) -> None:
            self._reward = build_reward(self.reward_spec, allow_user_code=allow_user_code)

        def reward_stats(self):  # noqa: ANN201
            return self._reward.stats if self._reward is not None else None

        def sample_prompts(self, rng: random.Random, count: int) -> list[Prompt]:
            return [Prompt(f"{rng.randrange(5)}+{rng.randrange(5)}=") for _ in range(count)]

        def reward(self, prompt: str, completion: str) -> float:
            a, b = prompt[:-1].split("+")
            return self._reward([prompt], [completion], answer=[str((int(a) + int(b)) % 10)])[0]

    yield {"name": "sums-rewarded", "reward": ["exact_match", "owner_judge:stubborn"]}
    TASKS.pop("sums-rewarded", None)
    sys.modules.pop("owner_judge", None)


def job(task: dict, store, server, base) -> m.Assign:
    return assign(1, snapshot(store, server, base), digest=base.sha256).model_copy(update={"task": task})


def test_a_worker_without_the_opt_in_refuses_the_job_with_its_reason_and_stays_up(
        tmp_path, learner_side, tiny_model_dir, rewarded_task):
    store, server = learner_side
    base = store.write_base(tiny_model_dir)

    async def scenario() -> tuple:
        session, socket = make_session(tmp_path, [])
        assert session.config.allow_user_code is False  # the default
        session.heartbeat_interval = 0.2
        beats = asyncio.create_task(session._heartbeats())
        await push(session, job(rewarded_task, store, server, base))
        await until(lambda: any(h["state"] == "failed" for h in socket.of("heartbeat")), "a heartbeat saying why")
        await asyncio.sleep(0.5)  # no restart follows
        reason = next(h["reason"] for h in socket.of("heartbeat") if h["state"] == "failed" and h["refused"])
        line = status.describe(status.view_of(session, status.Reporter(), time.monotonic())).text
        beats.cancel()
        done = session.rollout_task.done()
        session._stop_rollout()
        return reason, submits(socket), session.rollout.failures, done, line, "owner_judge" in sys.modules

    reason, sent, failures, done, line, imported = asyncio.run(scenario())
    assert reason.startswith("refuses the job: reward: runs user code (owner_judge:stubborn) and this worker does "
                             "not run user code"), reason
    assert "--allow-user-code" in reason and len(reason) <= 200
    assert sent == [] and failures == 0 and done  # nothing leased, no crash, no restart loop
    assert not imported  # the owner's module was never imported
    assert line.startswith("job 1: this worker refuses the job: reward: runs user code"), line


def test_with_the_opt_in_the_users_function_runs_and_its_errors_travel_with_the_group(
        tmp_path, learner_side, tiny_model_dir, rewarded_task, caplog):
    store, server = learner_side
    base = store.write_base(tiny_model_dir)

    async def scenario() -> list[dict]:
        session, socket = make_session(tmp_path, [])
        session.config = dataclasses.replace(session.config, allow_user_code=True)
        await push(session, job(rewarded_task, store, server, base))
        await until(lambda: submits(socket), "the first lease request")
        lease = m.Lease(job_id=1, timeout=30, leases=[m.LeasedPrompt(lease_id="l1", group_id="g1", prompt="1+2=")])
        await push(session, answering(socket, lease))
        await until(lambda: returned(socket), "a generated group")
        again = m.Lease(job_id=1, timeout=30, leases=[m.LeasedPrompt(lease_id="l2", group_id="g2", prompt="2+2=")])
        await push(session, answering(socket, again))
        await answer_each(session, socket, m.NoWork(job_id=1, retry_after=30), lambda: len(returned(socket)) == 2,
                          "a second group: the worker goes on")  # (the lease asked for ahead meanwhile: none)
        assert session.rollout.failures == 0 and session.rollout.failure is None
        session._stop_rollout()
        return returned(socket)

    first, second = asyncio.run(scenario())
    for group in (first, second):
        assert [r["reward"] for r in group["records"]] == [1.0 if r["completion"].strip() == str(
            sum(map(int, group["records"][0]["prompt"][:-1].split("+")))) else 0.0 for r in group["records"]]
        assert group["reward_errors"] == {"errors": 2, "non_finite": 0,  # one per record (group size 2)
                                          "last_error": "owner_judge:stubborn: RuntimeError: the judge is down"}
    m.Submit.model_validate({"type": "submit", "job_id": 1, "groups": [first]})  # the site's schema takes it
    assert "job 1: reward functions failed on 2 records (0 non-finite); last: owner_judge:stubborn: RuntimeError" \
        in caplog.text, "and in the agent's own log"


def test_the_run_flag_opts_in_on_the_config_and_for_code_that_asks_the_process(monkeypatch, caplog) -> None:
    # setenv first, so that monkeypatch restores the variable's absence: _opt_in writes os.environ itself, and a
    # bare delenv of an absent variable records nothing to undo (the opt-in leaked into every later test).
    monkeypatch.setenv("ECHO2_ALLOW_USER_CODE", "0")
    monkeypatch.delenv("ECHO2_ALLOW_USER_CODE")
    cfg = AgentConfig(server="http://127.0.0.1:9", worker_id=7, name="rig", agent_key="k")
    _opt_in(cfg, False)
    assert cfg.allow_user_code is False and "ECHO2_ALLOW_USER_CODE" not in os.environ
    _opt_in(cfg, True)
    assert cfg.allow_user_code is True and os.environ["ECHO2_ALLOW_USER_CODE"] == "1"
    assert "their reward functions can do anything" in caplog.text


class ClosingSocket(RecordingSocket):
    """A site that closes the socket at once: the session sends its hello and ends."""

    def __aiter__(self):
        return self

    async def __anext__(self):
        raise StopAsyncIteration


@pytest.mark.parametrize("opted_in", [False, True])
def test_the_hello_declares_the_opt_in_to_the_site(tmp_path, opted_in) -> None:
    session, _ = make_session(tmp_path, [])
    session.config = dataclasses.replace(session.config, allow_user_code=opted_in)
    socket = ClosingSocket()
    session.connection.attach(socket)
    asyncio.run(session._session())
    hello = m.parse_agent_json(socket.frames[0])
    assert isinstance(hello, m.Hello) and hello.allow_user_code is opted_in
