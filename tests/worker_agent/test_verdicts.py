"""The agent keeps its work until the site judges it, and stops asking for a job's work once the site says it left
the job (a recording socket stands in for the site; the engine and snapshots are real, as in test_session)."""

from __future__ import annotations

import asyncio
import time

from dataplane import messages as m
from worker_agent import rollout_loop, status

from .test_session import (  # noqa: F401 (learner_side: a fixture)
    answering,
    assign,
    generating,
    learner_side,
    make_session,
    push,
    returned,
    snapshot,
    submits,
    until,
)


def test_groups_the_site_could_not_take_go_again_with_the_next_request_until_judged(tmp_path, learner_side,  # noqa: F811
                                                                                    tiny_model_dir, monkeypatch):
    """The site answered "send it again" (its Redis away) until the submit's deadline: the generated group is not
    dropped; the next request carries it again, under a new id, and once accepted it is counted once."""
    monkeypatch.setattr(rollout_loop, "RETURN_DEADLINE_S", 0.5)
    store, server = learner_side
    base = store.write_base(tiny_model_dir)

    async def scenario() -> None:
        session, socket = await generating(tmp_path, store, server, base)
        first = submits(socket)[-1]
        assert [g["lease_id"] for g in first["groups"]] == ["l1"]
        answered: set[int] = set()
        deadline = time.monotonic() + 20
        while not any(s["id"] != first["id"] and s["groups"] for s in submits(socket)):
            for i, request in enumerate(submits(socket)):
                if request["id"] == first["id"] and i not in answered:
                    answered.add(i)
                    await push(session, m.Rejected(reason="the site cannot handle it now (ConnectionError)",
                                                   ref="submit", ref_id=first["id"], retry_after=0.3))
            assert time.monotonic() < deadline, "the group was not sent again"
            await asyncio.sleep(0.05)
        again = next(s for s in submits(socket) if s["id"] != first["id"] and s["groups"])
        assert again["groups"] == first["groups"] and session.rollout.generated == 0
        await push(session, answering(socket, m.NoWork(job_id=1, retry_after=30), request=again))
        await until(lambda: session.rollout.generated == 2, "the group counted")
        assert not session.rollout_task.done()
        session._stop_rollout()

    asyncio.run(scenario())


def test_an_agent_told_it_left_the_job_stops_asking_and_says_it_is_idle(tmp_path, learner_side,  # noqa: F811
                                                                         tiny_model_dir):
    """The job completed while its release was lost: the site answers the lease request "this worker was released
    from it". The loop stops (it once asked again every second for 18 minutes) and the status line says why."""
    store, server = learner_side
    base = store.write_base(tiny_model_dir)

    async def scenario() -> None:
        session, socket = await generating(tmp_path, store, server, base)
        request = submits(socket)[-1]
        await push(session, m.Rejected(reason="job_id: job 1 is completed; this worker was released from it",
                                       ref="submit", ref_id=request["id"]))
        await until(lambda: session.rollout_task.done(), "the rollout loop to stop")
        asked = len(submits(socket))
        await asyncio.sleep(1.5)
        assert len(submits(socket)) == asked and returned(socket)
        assert session.assignment is None and "released from job 1" in session.released
        said = status.describe(status.view_of(session, status.Reporter(), time.monotonic()))
        assert said.text.startswith("idle: not activated (released from job 1: ")

    asyncio.run(scenario())


def test_an_idle_agent_backs_off_with_jitter_from_the_sites_retry_after_to_the_cap():
    """No work again and again: the waits grow from the site's ``retry_after`` (never shorter) to
    ``IDLE_WAIT_CAP_S``, drawn at random, so a fleet that ran dry together does not poll at 0.2 s in step."""
    fleets = []
    for _ in range(2):
        waits, previous = [], None
        for _ in range(12):
            wait, previous = rollout_loop.idle_wait(retry_after=0.2, previous=previous)
            waits.append(wait)
        fleets.append(waits)
    for waits in fleets:
        assert waits[0] == 0.2 and all(0.2 <= w <= rollout_loop.IDLE_WAIT_CAP_S for w in waits)
        assert min(waits[-4:]) >= rollout_loop.IDLE_WAIT_CAP_S / 2  # settled near the cap
    assert fleets[0][1:] != fleets[1][1:]  # not in step
    assert rollout_loop.idle_wait(retry_after=5.0, previous=4.0)[0] >= 5.0  # a longer retry_after is kept


def test_a_reply_that_does_not_come_is_waited_for_longer_at_each_resend(tmp_path, learner_side,  # noqa: F811
                                                                        tiny_model_dir, monkeypatch):
    """The site answers slower than the reply timeout (a loaded site): each resend of the same request waits twice
    as long as the one before, so a fleet does not send the same request again and again at its timeout (1,480
    resends in 5 minutes, each run again by the site)."""
    import worker_agent.timing as timing

    monkeypatch.setattr(timing, "REPLY_FLOOR_S", 0.2)
    monkeypatch.setattr(timing, "REPLY_CEILING_S", 0.2)
    monkeypatch.setattr(rollout_loop, "LEASE_DEADLINE_S", 60.0)
    store, server = learner_side
    base = store.write_base(tiny_model_dir)

    async def scenario() -> None:
        session, socket = make_session(tmp_path, [])
        await push(session, assign(1, snapshot(store, server, base), digest=base.sha256))
        await until(lambda: submits(socket), "the first lease request")
        await asyncio.sleep(3.0)  # 0.2 s each: 15 sendings; doubling (0.2, 0.4, 0.8, 1.6): 4 or 5
        sendings = len(submits(socket))
        assert 2 <= sendings <= 5 and len({s["id"] for s in submits(socket)}) == 1
        session._stop_rollout()

    asyncio.run(scenario())
