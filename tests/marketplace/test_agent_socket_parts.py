"""A group too big for one websocket frame, over the real consumer (Channels communicator, real Redis): the site
announces its limit, the agent sends the group in parts, the site joins them and takes the group whole or not at all;
a record too big for any frame hands its lease back instead of being resent forever."""

from __future__ import annotations

import asyncio
import json

import pytest
from channels.db import database_sync_to_async

from dataplane import messages as m
from dataplane import replay
from dataplane.groupcodec import decode_group
from dataplane.records import Trajectory, TrajectoryGroup
from dataplane.tasks import build_task
from learner.prompts import PromptFeeder
from marketplace import services
from marketplace.models import Job
from worker_agent.cache import BaseCache
from worker_agent.config import AgentConfig
from worker_agent.rollout_loop import RolloutLoop
from worker_agent.session import AgentSession
from worker_agent.submit import frames

from ..groups import stream_entries
from .test_agent_socket import connect, setup_job_and_worker, started_with

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("redis_url")]

LIMIT = 4096


@pytest.fixture
def small_frames(settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    settings.ECHO2 = {**settings.ECHO2, "WS_MAX_MESSAGE_BYTES": LIMIT}
    return settings


LONG = 512  # the jobs here allow completions this long: the records are big so that groups need parts


def answer(job_id: int, lease: dict, tokens: int = 60, n: int = 4) -> TrajectoryGroup:
    """The group an agent builds for ``lease``: ``n`` records of ``tokens`` tokens (about 35 bytes each)."""
    return TrajectoryGroup.of([Trajectory(
        job_id=job_id, lease_id=lease["lease_id"], group_id=lease["group_id"], prompt=lease["prompt"],
        prompt_ids=[1, 5, 6], completion="7" * tokens, completion_ids=[12] * tokens,
        logprobs=[-0.123456789 * (i + 1) for _ in range(tokens)], reward=float(i % 2), version=0) for i in range(n)])


async def leased(comm, redis_client, job, groups: int = 1) -> list[dict]:
    PromptFeeder(redis_client, job_id=job.pk, task=build_task({"name": "arithmetic"}), seed=0, backlog=2).top_up()
    await comm.send_json_to({"type": "lease_request", "job_id": job.pk, "groups": groups})
    return (await comm.receive_json_from())["leases"]


def compact(message: dict) -> str:
    """JSON as the agent writes it (pydantic: no spaces), so a part stays under the limit."""
    return json.dumps(message, separators=(",", ":"))


def pending(redis_client, job) -> int:
    return redis_client.xpending(replay.prompts_key(job.pk), replay.PROMPT_GROUP)["pending"]


async def test_a_group_bigger_than_a_frame_reaches_the_stream_whole_in_parts(small_frames, redis_client):
    job, worker, key = await setup_job_and_worker(max_new_tokens=LONG)
    comm = await connect(key)
    await comm.send_json_to({"type": "hello", "agent_version": "test"})
    assert (await comm.receive_json_from())["max_message_bytes"] == LIMIT  # the welcome announces it
    await comm.disconnect()
    comm = await connect(key)
    await started_with(comm, job)
    lease = (await leased(comm, redis_client, job))[0]
    group = answer(job.pk, lease)
    assert len(m.Trajectories(group=group).model_dump_json()) > LIMIT  # one frame would be closed with 4413

    texts = frames(m.Trajectories(group=group, id="r5"), limit=LIMIT)
    assert len(texts) >= 2 and all(len(text.encode()) <= LIMIT for text in texts)
    for text in texts[:-1]:
        await comm.send_to(text_data=text)
    assert await comm.receive_nothing(0.2)  # no reply while parts are still to come
    await comm.send_to(text_data=texts[-1])
    reply = await comm.receive_json_from()
    assert (reply["type"], reply["accepted"], reply["rejected"], reply["ref_id"]) == ("accepted", 4, 0, "r5")

    entries = stream_entries(redis_client, replay.trajectories_key(job.pk))
    assert len(entries) == 1 and decode_group(entries[0][1]["data"]) == group
    assert pending(redis_client, job) == 0
    await comm.disconnect()


async def test_malformed_parts_get_a_reason_and_lose_nothing(small_frames, redis_client):
    job, worker, key = await setup_job_and_worker(max_new_tokens=LONG)
    comm = await connect(key)
    await started_with(comm, job)
    lease = (await leased(comm, redis_client, job))[0]
    texts = [json.loads(text) for text in frames(m.Trajectories(group=answer(job.pk, lease), id="r1"), limit=2000)]
    assert len(texts) == 4  # one record each

    async def refused(*parts: dict) -> dict:
        for part in parts:
            await comm.send_to(text_data=compact(part))
        reply = await comm.receive_json_from()
        assert (reply["type"], reply["ref"], reply["ref_id"]) == ("rejected", "trajectories_part", "r1"), reply
        return reply

    assert "parts start at 0, in order" in (await refused(texts[1]))["reason"]  # nothing in assembly
    other = {**texts[1], "group": {**texts[1]["group"], "version": 1,
                                   "records": [r | {"version": 1} for r in texts[1]["group"]["records"]]}}
    assert "group.version: part 1 says 1, the group in assembly 0" in (await refused(texts[0], other))["reason"]
    assert "part 1: a duplicate, expected part 2 of 4" in (await refused(texts[0], texts[1], texts[1]))["reason"]
    assert "out of range" in (await refused(texts[0] | {"part": 9}))["reason"]  # refused by the schema
    bad = {**texts[1], "group": {**texts[1]["group"], "records": [
        r | {"logprobs": [0.5] * len(r["logprobs"])} for r in texts[1]["group"]["records"]]}}
    assert "logprobs must be finite and <= 0" in (await refused(texts[0], bad))["reason"]
    assert "no group of lease" in (await refused(texts[1]))["reason"]  # the bad part dropped the assembly
    assert redis_client.xlen(replay.trajectories_key(job.pk)) == 0 and pending(redis_client, job) == 1

    for part in texts:  # the lease is still open: the same group, sent right, is accepted
        await comm.send_to(text_data=compact(part))
    assert (await comm.receive_json_from())["accepted"] == 4
    await comm.disconnect()


async def test_parts_over_what_a_group_of_the_job_can_take_are_refused(settings, redis_client):
    """4 records of up to 8 tokens take under 7 MB of JSON (marketplace/core/assembly.py); 2 MB of metadata each
    (frames well under the 8 MiB limit) pass that at the fourth part."""
    settings.CELERY_TASK_ALWAYS_EAGER = True
    job, worker, key = await setup_job_and_worker(max_new_tokens=LONG)
    comm = await connect(key)
    await started_with(comm, job)
    lease = (await leased(comm, redis_client, job))[0]
    group = answer(job.pk, lease, tokens=8)
    for i, rec in enumerate(group.records):
        rec = rec.model_copy(update={"metadata": {"pad": "x" * (2 << 20)}})
        part = m.TrajectoriesPart(group=TrajectoryGroup.of([rec]), part=i, parts=4, id="r3")
        await comm.send_to(text_data=part.model_dump_json())
    reply = await comm.receive_json_from(timeout=30)
    assert reply["type"] == "rejected" and reply["reason"].startswith("the parts exceed "), reply
    assert "the most a group of this job can take" in reply["reason"]
    assert redis_client.xlen(replay.trajectories_key(job.pk)) == 0 and pending(redis_client, job) == 1
    await comm.disconnect()


async def test_a_frame_over_the_limit_still_closes_4413_with_a_reason_that_says_split(small_frames):
    _, _, key = await setup_job_and_worker(max_new_tokens=LONG)
    comm = await connect(key)
    await comm.send_to(text_data='{"type": "heartbeat", "pad": "' + "x" * LIMIT + '"}')
    assert "exceeds the site's limit of 4096 bytes; split it" in (await comm.receive_json_from())["reason"]
    assert (await comm.receive_output())["code"] == 4413


class CommunicatorSocket:
    """The agent's websocket, as the real consumer's communicator."""

    def __init__(self, comm) -> None:
        self.comm = comm

    async def send(self, text: str) -> None:
        await self.comm.send_to(text_data=text)


async def pump(comm, session: AgentSession) -> None:
    """The agent's reader: every site frame to the session, except the assignment (this test drives the agent's
    return path itself, without an engine)."""
    while True:
        frame = await comm.receive_from(timeout=60)
        if json.loads(frame)["type"] != "assign":
            await session._dispatch(frame)


async def test_the_agent_sends_a_big_group_in_parts_and_hands_back_one_it_cannot_send(small_frames, redis_client,
                                                                                        tmp_path):
    job, worker, key = await setup_job_and_worker(max_new_tokens=LONG)
    comm = await connect(key)
    config = AgentConfig(server="http://127.0.0.1:9", worker_id=worker.pk, name="rig", agent_key=key)
    session = AgentSession(config, engine_factory=None, cache=BaseCache(tmp_path / "cache", max_bytes=10**6))
    session.connection.attach(CommunicatorSocket(comm))
    session.connection.welcomed.set()  # at once: the welcome the reader below hands on sets the budget
    reader = asyncio.create_task(pump(comm, session))
    await session.connection.send(m.Hello(agent_version="test"))
    PromptFeeder(redis_client, job_id=job.pk, task=build_task({"name": "arithmetic"}), seed=0, backlog=2).top_up()
    await database_sync_to_async(services.job_start)(job=await database_sync_to_async(Job.objects.get)(pk=job.pk))
    reply = await session.connection.request(m.Submit(job_id=job.pk, lease=2), deadline_s=30)
    assert session.connection.max_message_bytes == LIMIT and isinstance(reply.lease, m.Lease), reply
    big, huge = (lease.model_dump() for lease in reply.lease.leases)
    loop = RolloutLoop(m.Assign(job_id=job.pk, model="m", task={"name": "arithmetic"}, group_size=2,
                                max_new_tokens=LONG, temperature=1.0),
                       connection=session.connection, installs=session.installs, rollout=session.rollout,
                       tally=session.tally, meter=session.meter, report_state=session.report_state,
                       groups_per_lease=1, retry_delay=1.0)

    assert await loop._return_and_lease([answer(job.pk, big)], lease=0) is None  # over the limit: in parts
    assert session.rollout.generated == 4 and redis_client.xlen(replay.trajectories_key(job.pk)) == 1
    await loop._return_and_lease([answer(job.pk, huge, tokens=400)], lease=0)  # one record alone is over the limit
    again = await session.connection.request(m.Submit(job_id=job.pk, lease=1), deadline_s=30)
    assert isinstance(again.lease, m.Lease) and again.lease.leases[0].lease_id == huge["lease_id"]  # handed back
    assert replay.ReplayBuffer(redis_client, job.pk).counters()["returned_leases"] == 1
    assert not reader.done(), "the socket was closed"
    reader.cancel()
    await comm.disconnect()


async def test_a_lease_that_is_not_the_workers_cannot_be_handed_back(small_frames, redis_client):
    job, worker, key = await setup_job_and_worker(max_new_tokens=LONG)
    comm = await connect(key)
    await started_with(comm, job)
    await comm.send_json_to({"type": "lease_return", "job_id": job.pk, "lease_id": "1-0"})
    assert (await comm.receive_json_from())["reason"] == "lease_id: '1-0' is not leased to this worker"
    await comm.send_json_to({"type": "lease_return", "job_id": job.pk, "lease_id": "nope"})
    assert (await comm.receive_json_from())["reason"].startswith("lease_id: 'nope' is not a lease")
    await comm.disconnect()
