"""A site process that answers late tells its agents to slow down (marketplace/realtime/lag.py), over the real
consumer: once rollout replies lag past ``ECHO2_REPLY_LAG_S`` on average the socket announces a lower message
budget (a ``welcome`` again, which agents take at any time), and none while they do not."""

from __future__ import annotations

import pytest

from marketplace.realtime import lag

from .test_agent_socket import connect, settings_eager, setup_job_and_worker, started_with  # noqa: F401
from .test_agent_socket_budget import submit

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("redis_url", "settings_eager")]


async def answers(comm, job, request_id: str) -> list[dict]:
    """The frames that answer a lease request: its reply, and a welcome if the budget is announced again."""
    await comm.send_to(text_data=submit(job.pk, request_id, lease=1))
    frames = [await comm.receive_json_from(timeout=10)]
    if not await comm.receive_nothing(timeout=0.5):
        frames.append(await comm.receive_json_from(timeout=1))
    return frames


async def test_replies_that_lag_lower_the_announced_budget_and_prompt_ones_do_not(settings, monkeypatch):
    monkeypatch.setattr(lag, "REPLIES", lag.LagMeter())
    job, _, key = await setup_job_and_worker()
    comm = await connect(key)
    await started_with(comm, job)
    full = settings.ECHO2["AGENT_MESSAGES_PER_S"]
    settings.ECHO2 = {**settings.ECHO2, "REPLY_LAG_S": 3600.0}  # never late
    assert [f["type"] for f in await answers(comm, job, "q1")] == ["submitted"]
    settings.ECHO2 = {**settings.ECHO2, "REPLY_LAG_S": 1e-9}  # every answer is late
    lag.REPLIES.average = 1.0  # a second on average: far past it
    frames = await answers(comm, job, "q2")
    assert [f["type"] for f in frames] == ["submitted", "welcome"]
    assert frames[1]["messages_per_s"] == pytest.approx(full * lag.MIN_SHARE)
    assert frames[1]["message_burst"] < settings.ECHO2["AGENT_MESSAGE_BURST"]
    assert [f["type"] for f in await answers(comm, job, "q3")] == ["submitted"]  # announced once, not per reply
    await comm.disconnect()
