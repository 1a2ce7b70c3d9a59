"""Resends are free and exact, over the real consumer (Channels communicator, real Redis): a request sent again
under its id gets the verdict its first sending got without running again; a group already stored is accepted
whatever request carries it; a failure after storing never turns a stored group into an error; a site that cannot
reach its store answers ``retry_after``, never a verdict."""

from __future__ import annotations

import pytest

from dataplane import replay
from dataplane.tasks import build_task
from echo2_site.demo import free_port
from learner.prompts import PromptFeeder
from marketplace.infra import stream, telemetry, verdicts

from .test_agent_socket import connect, settings_eager, setup_job_and_worker, started_with  # noqa: F401
from .test_agent_socket_budget import submit
from .test_agent_socket_parts import answer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("redis_url", "settings_eager")]


async def leasing(comm, redis_client, job, request_id: str, groups: int = 2) -> dict:
    PromptFeeder(redis_client, job_id=job.pk, task=build_task({"name": "arithmetic"}), seed=0, backlog=4).top_up()
    await comm.send_to(text_data=submit(job.pk, request_id, lease=groups))
    return await comm.receive_json_from(timeout=5)


async def test_a_resent_submit_gets_its_first_verdict_and_is_not_run_again(redis_client):
    """The agent's reply timeout passed while the site was slow: the same submit arrives twice. The second gets the
    first's replies, word for word: the same lease (no more prompts taken), the groups accepted (not refused as
    expired), nothing appended twice."""
    job, worker, key = await setup_job_and_worker(batch_trajectories=12)
    comm = await connect(key)
    await started_with(comm, job)
    first = await leasing(comm, redis_client, job, "s1")
    await comm.send_to(text_data=submit(job.pk, "s1", lease=2))
    assert await comm.receive_json_from(timeout=5) == first  # the same two prompts, not two more
    pending = redis_client.xpending(replay.prompts_key(job.pk), replay.PROMPT_GROUP)["pending"]
    assert pending == 2
    groups = [answer(job.pk, lease, tokens=4) for lease in first["lease"]["leases"]]
    frame = submit(job.pk, "s2", groups, lease=1)
    await comm.send_to(text_data=frame)
    told = await comm.receive_json_from(timeout=5)
    for _ in range(3):
        await comm.send_to(text_data=frame)
        assert await comm.receive_json_from(timeout=5) == told
    assert [r["accepted"] for r in told["results"]] == [4, 4]
    assert redis_client.xlen(replay.trajectories_key(job.pk)) == 2
    counters = replay.ReplayBuffer(redis_client, job.pk).counters()
    assert counters["accepted_groups"] == 2 and counters.get("rejected_records", 0) == 0
    assert verdicts.resent_counts() == {worker.pk: 4}
    await comm.disconnect()


async def test_a_stored_group_sent_again_after_a_reconnect_under_a_new_id_is_accepted(redis_client):
    """A reconnect lost the reply; the agent (or a restarted one) sends the group again in a new request. The lease
    is answered and gone, but the group is the one stored from this worker: accepted, told once more, not refused
    "lease expired or unknown"."""
    job, _, key = await setup_job_and_worker()
    comm = await connect(key)
    await started_with(comm, job)
    lease = (await leasing(comm, redis_client, job, "t1", groups=1))["lease"]["leases"][0]
    group = answer(job.pk, lease, tokens=4)
    await comm.send_to(text_data=submit(job.pk, "t2", [group]))
    assert (await comm.receive_json_from(timeout=5))["results"][0]["accepted"] == 4
    await comm.disconnect()
    comm = await connect(key)
    await comm.send_json_to({"type": "hello", "agent_version": "test", "job_id": job.pk, "installed_version": 0})
    await comm.receive_json_from(timeout=5)
    await comm.send_to(text_data=submit(job.pk, "u1", [group]))
    reply = await comm.receive_json_from(timeout=5)
    while reply["type"] != "submitted":
        reply = await comm.receive_json_from(timeout=5)
    assert reply["results"][0]["accepted"] == 4 and reply["results"][0]["reasons"] == []
    assert redis_client.xlen(replay.trajectories_key(job.pk)) == 1
    await comm.disconnect()


async def test_a_failure_after_the_groups_are_stored_leaves_them_accepted(redis_client):
    """Redis fails the lease's bookkeeping after the submit's groups were stored (here: the billing key holds the
    wrong type, a real WRONGTYPE error): the groups are still told accepted, and the lease still comes."""
    job, worker, key = await setup_job_and_worker(batch_trajectories=12)
    comm = await connect(key)
    await started_with(comm, job)
    leases = (await leasing(comm, redis_client, job, "w1"))["lease"]["leases"]
    redis_client.delete(telemetry.observed_key(worker.pk, job.pk))
    redis_client.set(telemetry.observed_key(worker.pk, job.pk), "not a hash")
    await comm.send_to(text_data=submit(job.pk, "w2", [answer(job.pk, x, tokens=4) for x in leases], lease=1))
    reply = await comm.receive_json_from(timeout=5)
    assert reply["type"] == "submitted" and [r["accepted"] for r in reply["results"]] == [4, 4]
    assert len(reply["lease"]["leases"]) == 1
    await comm.disconnect()


async def test_a_site_that_cannot_reach_redis_answers_retry_after_not_a_verdict(settings, redis_url, redis_client):
    """Redis down (nothing listens where the site looks for it): the request is neither refused nor lost; it is to be
    sent again (``retry_after``), and once Redis is back the same request runs and gets its verdict."""
    job, _, key = await setup_job_and_worker()
    comm = await connect(key)
    await started_with(comm, job)
    assert (await leasing(comm, redis_client, job, "x0", groups=1))["type"] == "submitted"  # the assign followed
    try:
        settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
        settings.ECHO2 = {**settings.ECHO2, "REDIS_RETRY_S": 0.2}
        stream.client.cache_clear()
        await comm.send_to(text_data=submit(job.pk, "x1", lease=1))
        refused = await comm.receive_json_from(timeout=10)
        assert refused["type"] == "rejected" and refused["ref_id"] == "x1" and refused["retry_after"] > 0
    finally:
        settings.REDIS_URL = redis_url
        stream.client.cache_clear()
    await comm.send_to(text_data=submit(job.pk, "x1", lease=1))
    again = await comm.receive_json_from(timeout=10)
    assert again["type"] == "submitted" and again["ref_id"] == "x1" and len(again["lease"]["leases"]) == 1
    await comm.disconnect()


def test_verdicts_are_kept_past_every_resend_an_agent_can_make():
    from dataplane.replay import RESEND_MEMORY_S
    from worker_agent import rollout_loop

    deadline = max(rollout_loop.RETURN_DEADLINE_S, rollout_loop.LEASE_DEADLINE_S)
    assert deadline < verdicts.VERDICT_MEMORY_S  # a resend under the same id comes within its request's deadline
    assert RESEND_MEMORY_S > rollout_loop.KEEP_UNSENT_S  # a kept group is recognised as stored for as long as kept


@pytest.fixture
def streams_round_trips(monkeypatch):
    """The commands the site sends to the streams' Redis, one entry per round trip (a pipeline or a script call is
    one), on the threads' client and the event loop's (``stream.async_client``) alike, connection handshakes left
    out: each pool makes counting connections from here on."""
    sent: list[bytes] = []
    pool = stream.client().connection_pool
    base = pool.connection_class

    def packed(command) -> bytes:
        return b"".join(command) if isinstance(command, list) else bytes(command)

    class Counting(base):
        handshaking = False

        def on_connect(self):
            self.handshaking = True
            try:
                super().on_connect()
            finally:
                self.handshaking = False

        def send_packed_command(self, command, check_health=True):
            if not self.handshaking:
                sent.append(packed(command))
            return super().send_packed_command(command, check_health)

    class CountingAsync:
        handshaking = False

        async def on_connect(self):
            self.handshaking = True
            try:
                await super().on_connect()
            finally:
                self.handshaking = False

        async def send_packed_command(self, command, check_health=True):
            if not self.handshaking:
                sent.append(packed(command))
            return await super().send_packed_command(command, check_health)

    made = stream.async_client

    def counted_async_client(*args, **kwargs):
        client = made(*args, **kwargs)
        loop_pool = client.connection_pool
        if not issubclass(loop_pool.connection_class, CountingAsync):
            loop_pool.connection_class = type("Counting", (CountingAsync, loop_pool.connection_class), {})
        return client

    monkeypatch.setattr(stream, "async_client", counted_async_client)
    pool.connection_class = Counting
    pool.disconnect()
    yield sent
    pool.connection_class = base
    pool.disconnect()


async def test_a_submit_is_one_round_trip_to_redis_and_so_is_its_resend(redis_client, streams_round_trips):
    """Groups returned, leases renewed, more leased, billing marks and the verdict kept for a resend: one script
    call; a resend answered from its kept verdict: one more. A lone lease request, likewise."""
    job, worker, key = await setup_job_and_worker(batch_trajectories=12)
    comm = await connect(key)
    await started_with(comm, job)
    first = await leasing(comm, redis_client, job, "r1")  # the scripts are loaded by now
    del streams_round_trips[:]
    await comm.send_to(text_data=submit(job.pk, "r1", lease=2))
    assert await comm.receive_json_from(timeout=5) == first
    assert len(streams_round_trips) == 1
    del streams_round_trips[:]
    frame = submit(job.pk, "r2", [answer(job.pk, lease, tokens=4) for lease in first["lease"]["leases"]], lease=1)
    await comm.send_to(text_data=frame)
    told = await comm.receive_json_from(timeout=5)
    assert [r["accepted"] for r in told["results"]] == [4, 4] and len(told["lease"]["leases"]) == 1
    assert len(streams_round_trips) == 1 and b"EVALSHA" in streams_round_trips[0]
    await comm.send_to(text_data=frame)
    assert await comm.receive_json_from(timeout=5) == told
    assert len(streams_round_trips) == 2
    assert redis_client.xlen(replay.trajectories_key(job.pk)) == 2
    assert verdicts.resent_counts() == {worker.pk: 2}
    await comm.disconnect()


async def test_a_resend_after_the_worker_was_released_gets_the_verdict_its_groups_got(redis_client):
    """The first sending stored the groups, its reply was lost, and the worker was released before the resend came:
    the resend is told what the first sending got (accepted), not "not active in this job"."""
    from asgiref.sync import sync_to_async

    from marketplace import services
    from marketplace.models import Activation

    job, worker, key = await setup_job_and_worker(batch_trajectories=12)
    comm = await connect(key)
    await started_with(comm, job)
    leases = (await leasing(comm, redis_client, job, "v1"))["lease"]["leases"]
    frame = submit(job.pk, "v2", [answer(job.pk, lease, tokens=4) for lease in leases])
    await comm.send_to(text_data=frame)
    told = await comm.receive_json_from(timeout=5)
    assert [r["accepted"] for r in told["results"]] == [4, 4]
    activation = await sync_to_async(Activation.objects.get)(worker=worker, job=job, ended_at=None)
    await sync_to_async(services.worker_release)(activation=activation, reason="test")
    assert (await comm.receive_json_from(timeout=5))["type"] == "release"
    await comm.send_to(text_data=frame)
    assert await comm.receive_json_from(timeout=5) == told
    await comm.send_to(text_data=submit(job.pk, "v3", lease=1))  # a new request is refused as ever
    refused = await comm.receive_json_from(timeout=5)
    assert refused["type"] == "rejected" and "active" in refused["reason"]
    await comm.disconnect()
