"""A site process that runs late tells its agents to slow down (marketplace/realtime/lag.py): the share of the budget
it announces is halved every period its replies lag or its event loop runs late through most of it, raised again
while both are on time, and a socket announces it in a ``welcome`` sent again, over the real consumer."""

from __future__ import annotations

import asyncio
import time

import pytest

from marketplace.realtime import consumers, lag

from .test_agent_socket import connect, settings_eager, setup_job_and_worker, started_with  # noqa: F401
from .test_agent_socket_budget import submit


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_the_share_halves_per_period_late_down_to_its_floor_and_comes_back_by_quarters():
    clock = Clock()
    shedding = lag.Shedding(clock=clock)
    limits = {"loop_lag_s": 3600.0, "reply_lag_s": 1.0}
    assert shedding.share(**limits) == 1.0
    shedding.replies.average = 2.0  # replies lag past the limit
    clock.now = lag.ADJUST_EVERY_S / 2
    assert shedding.share(**limits) == 1.0  # not before a period has passed
    shares = []
    for period in range(1, 9):
        clock.now = period * lag.ADJUST_EVERY_S
        shares.append(shedding.share(**limits))
    assert shares == [0.5, 0.25, 0.125, 0.0625, 0.03125, lag.MIN_SHARE, lag.MIN_SHARE, lag.MIN_SHARE]
    shedding.replies.average = 0.7  # late no more, not yet well on time: held
    clock.now += lag.ADJUST_EVERY_S
    assert shedding.share(**limits) == lag.MIN_SHARE
    shedding.replies.average = 0.1
    clock.now += lag.ADJUST_EVERY_S
    assert shedding.share(**limits) == pytest.approx(lag.MIN_SHARE * lag.RAISE_BY)


async def test_a_loop_late_through_most_of_a_period_sheds_and_a_moment_late_does_not():
    clock = Clock()
    shedding = lag.Shedding(clock=clock)
    limits = {"loop_lag_s": 0.2, "reply_lag_s": 3600.0}
    shedding.share(**limits)  # the probe starts on this loop

    async def period(busy: bool) -> float:
        started = time.monotonic()
        while time.monotonic() - started < 2.0:  # twenty probes' worth
            if busy:
                time.sleep(0.5)  # the loop held: every probe comes late
            await asyncio.sleep(0.01 if busy else 0.02)
        clock.now += lag.ADJUST_EVERY_S
        return shedding.share(**limits)

    assert await period(busy=False) == 1.0
    assert await period(busy=True) == 0.5
    time.sleep(0.35)  # one moment late in a period otherwise on time
    assert await period(busy=False) == pytest.approx(0.5 * lag.RAISE_BY)
    assert shedding.loop_lag() < 0.2


async def answers(comm, job, request_id: str) -> list[dict]:
    """The frames that answer a lease request: its reply, and a welcome if the budget is announced again."""
    await comm.send_to(text_data=submit(job.pk, request_id, lease=1))
    frames = [await comm.receive_json_from(timeout=10)]
    if not await comm.receive_nothing(timeout=0.5):
        frames.append(await comm.receive_json_from(timeout=1))
    return frames


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("redis_url", "settings_eager")
async def test_a_socket_announces_the_lowered_budget_once_and_never_below_a_message_a_second(settings, monkeypatch):
    clock = Clock()
    monkeypatch.setattr(lag, "SHEDDING", lag.Shedding(clock=clock))
    monkeypatch.setattr(consumers, "REANNOUNCE_EVERY_S", 1.0)
    settings.ECHO2 = {**settings.ECHO2, "LOOP_LAG_S": 3600.0, "REPLY_LAG_S": 1.0}
    job, _, key = await setup_job_and_worker()
    comm = await connect(key)
    await started_with(comm, job)
    full, burst = settings.ECHO2["AGENT_MESSAGES_PER_S"], settings.ECHO2["AGENT_MESSAGE_BURST"]
    assert [f["type"] for f in await answers(comm, job, "q1")] == ["submitted"]  # on time: nothing announced
    lag.SHEDDING.replies.average = 5.0
    clock.now = lag.ADJUST_EVERY_S
    frames = await answers(comm, job, "q2")
    assert [f["type"] for f in frames] == ["submitted", "welcome"]
    assert frames[1]["messages_per_s"] == pytest.approx(full / 2)
    assert frames[1]["message_burst"] == pytest.approx(burst / 2)
    clock.now = 2 * lag.ADJUST_EVERY_S  # halved again, within the socket's REANNOUNCE_EVERY_S: not announced yet
    assert [f["type"] for f in await answers(comm, job, "q3")] == ["submitted"]
    for period in range(3, 12):
        clock.now = period * lag.ADJUST_EVERY_S
        lag.SHEDDING.share(loop_lag_s=3600.0, reply_lag_s=1.0)
    await asyncio.sleep(1.1)  # the socket's last announcement is older than REANNOUNCE_EVERY_S now
    frames = await answers(comm, job, "q4")
    assert [f["type"] for f in frames] == ["submitted", "welcome"]
    assert frames[1]["messages_per_s"] == pytest.approx(max(lag.MIN_MESSAGES_PER_S, full * lag.MIN_SHARE))
    await comm.disconnect()
