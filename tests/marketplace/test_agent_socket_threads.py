"""The agent socket's rollouts run off the database thread (``AgentConsumer._rollout``) and must make no query there:
a connection opened by a plain worker thread is never handed back to the pool (nothing closes it at the end of a
request), so it stays checked out for good; in production it eats the process's pool, at the end of a test session
PostgreSQL refuses to drop the test database ("is being accessed by other users"). The worker's earnings that a
submit's answer carries were such a query: now read on the database thread when due."""

from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import ThreadPoolExecutor

from channels.db import database_sync_to_async
from django.db import connections
from django.db.backends.signals import connection_created

from dataplane.tasks import build_task
from learner.prompts import PromptFeeder
from marketplace.infra import telemetry
from marketplace.realtime import dbthreads
from marketplace.services import rollouts

from .test_agent_socket import connect, settings_eager, setup_job_and_worker, started_with  # noqa: F401
from .test_agent_socket_budget import pytestmark, submit  # noqa: F401
from .test_agent_socket_parts import answer


async def test_a_submit_queries_the_database_only_on_the_sockets_database_threads(settings_eager):  # noqa: F811
    """Earnings are read on ``dbthreads``' threads, which hand their connection back around every call, never on a
    plain worker thread, where the connection would stay checked out of the pool for good."""
    job, worker, key = await setup_job_and_worker()
    connected: set[str] = set()

    def opened(sender, connection, **kwargs) -> None:
        connected.add(threading.current_thread().name)

    comm = await connect(key)
    await started_with(comm, job)
    # every thread opens its connection again, so each query below is seen on the thread it runs on
    await database_sync_to_async(connections.close_all)()
    await asyncio.to_thread(dbthreads.close_connections)
    connection_created.connect(opened)
    try:
        for request in ("s1", "s2"):
            rollouts._earned.pop(worker.pk, None)  # due: each answer reads the earnings again
            await comm.send_to(text_data=submit(job.pk, request, lease=1))
            reply = await comm.receive_json_from(timeout=10)
            assert reply["type"] == "submitted" and reply["earned_usd"] == 0.0, reply
    finally:
        connection_created.disconnect(opened)
        await comm.disconnect()
    assert connected and all(name.startswith("agent-db") for name in connected), \
        f"a query from a thread that never hands its connection back: {connected}"


async def recorded(redis_client, worker_id: int) -> list:
    """The worker's heartbeat samples in Redis, once there are any (a safety limit of 10 s, not a timing: while the
    test holds what it holds, the sample comes at once or never)."""
    for _ in range(200):
        samples = redis_client.lrange(telemetry.heartbeats_key(worker_id), 0, -1)
        if samples:
            return samples
        await asyncio.sleep(0.05)
    return []


async def test_a_heartbeat_is_handled_while_the_database_thread_is_busy(redis_client):
    """In a reconnect storm the one database thread is a queue of connects and hellos: a heartbeat never waits in
    it (Channels' dispatch passed every message through it first). Here the thread is held until the heartbeat is
    recorded; before, it was recorded only once the thread was let go."""
    _, worker, key = await setup_job_and_worker()
    comm = await connect(key)
    await comm.send_json_to({"type": "hello", "agent_version": "test"})
    assert (await comm.receive_json_from(timeout=10))["type"] == "welcome"
    release = threading.Event()
    held = asyncio.ensure_future(database_sync_to_async(release.wait)())
    try:
        await comm.send_json_to({"type": "heartbeat", "throughput": 7.0, "state": "idle"})
        samples = await recorded(redis_client, worker.pk)
        assert not held.done()
        assert [json.loads(s)[1] for s in samples] == [7.0]
    finally:
        release.set()
        await held
    await comm.disconnect()


async def test_a_heartbeat_is_handled_while_its_sockets_own_request_waits_on_the_database(redis_client):
    """A lease request that must read the job waits for a database thread; the heartbeat sent after it is recorded
    at once (it passes the socket's lane), and the request is still answered, in turn, once the threads are let go.
    Before, a socket's frames were handled one at a time: its heartbeats waited behind its requests (1,000 agents
    on two processes: heartbeats 30-75 s late)."""
    job, worker, key = await setup_job_and_worker()
    comm = await connect(key)
    await started_with(comm, job)
    release = threading.Event()
    held = [asyncio.wrap_future(dbthreads.executor().submit(release.wait)) for _ in range(dbthreads.size())]
    try:
        await comm.send_json_to({"type": "lease_request", "job_id": job.pk, "groups": 1, "id": "l1"})
        await comm.send_json_to({"type": "heartbeat", "throughput": 7.0, "state": "idle", "job_id": job.pk})
        samples = await recorded(redis_client, worker.pk)
        assert [json.loads(s)[1] for s in samples] == [7.0]
        assert await comm.receive_nothing(timeout=0.2)  # the lease request still waits for its read
    finally:
        release.set()
        await asyncio.gather(*held)
    reply = await comm.receive_json_from(timeout=10)
    assert reply["type"] in ("lease", "no_work") and reply["ref_id"] == "l1", reply
    await comm.disconnect()


async def test_a_heartbeat_is_handled_while_every_pooled_thread_is_busy(redis_client):
    """A heartbeat is recorded on the event loop's own Redis client: with every thread of the loop's pool held (the
    pool that rollouts' and other sockets' calls queue in), it is recorded at once. Before, it took a pool thread
    itself and waited for one to be let go."""
    _, worker, key = await setup_job_and_worker()
    comm = await connect(key)
    await comm.send_json_to({"type": "hello", "agent_version": "test"})
    assert (await comm.receive_json_from(timeout=10))["type"] == "welcome"
    loop = asyncio.get_running_loop()
    pool = ThreadPoolExecutor(max_workers=2)
    loop.set_default_executor(pool)
    release = threading.Event()
    held = [loop.run_in_executor(None, release.wait) for _ in range(2)]
    try:
        await comm.send_json_to({"type": "heartbeat", "throughput": 7.0, "state": "idle"})
        samples = await recorded(redis_client, worker.pk)
        assert not any(h.done() for h in held)
        assert [json.loads(s)[1] for s in samples] == [7.0]
    finally:
        release.set()
        await asyncio.gather(*held)
    await comm.disconnect()


async def test_a_lease_and_a_submit_are_answered_while_every_pooled_thread_is_busy(redis_client,
                                                                                    settings_eager):  # noqa: F811
    """Once the socket holds its job, leasing and submitting are Redis work on the event loop's own client: with
    every thread of the loop's pool held, a lease request and the submit that answers it are both answered. Before,
    each took a pool thread and waited for one to be let go."""
    job, worker, key = await setup_job_and_worker(batch_trajectories=12)
    comm = await connect(key)
    await started_with(comm, job)
    PromptFeeder(redis_client, job_id=job.pk, task=build_task({"name": "arithmetic"}), seed=0, backlog=2).top_up()
    await comm.send_to(text_data=submit(job.pk, "s0", lease=1))  # the socket reads its job and the earnings
    first = await comm.receive_json_from(timeout=10)
    assert first["type"] == "submitted" and len(first["lease"]["leases"]) == 1, first
    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(max_workers=2))
    release = threading.Event()
    held = [loop.run_in_executor(None, release.wait) for _ in range(2)]
    try:
        await comm.send_json_to({"type": "lease_request", "job_id": job.pk, "groups": 1, "id": "l1"})
        lease = await comm.receive_json_from(timeout=10)
        assert lease["type"] == "lease" and len(lease["leases"]) == 1, lease
        await comm.send_to(text_data=submit(job.pk, "s1", [answer(job.pk, first["lease"]["leases"][0], tokens=4)]))
        told = await comm.receive_json_from(timeout=10)
        assert told["type"] == "submitted" and [r["accepted"] for r in told["results"]] == [4], told
        assert not any(h.done() for h in held)
    finally:
        release.set()
        await asyncio.gather(*held)
    await comm.disconnect()


async def test_a_request_handled_after_its_socket_closed_is_done_and_its_reply_is_not_sent(redis_client,
                                                                                           monkeypatch):
    """The lane still handles what came before the close (up to 10 s), but its replies have no one to reach: under
    daphne, sending one raised in the lane and was logged as a failed request (1,000 agents stopping at once)."""
    from dataplane.replay import PROMPT_GROUP, prompts_key
    from marketplace.realtime.consumers import AgentConsumer

    closing_seen, real = asyncio.Event(), AgentConsumer.disconnect

    async def disconnect(self, code):
        closing_seen.set()
        await real(self, code)

    monkeypatch.setattr(AgentConsumer, "disconnect", disconnect)
    job, worker, key = await setup_job_and_worker()
    comm = await connect(key)
    await started_with(comm, job)
    PromptFeeder(redis_client, job_id=job.pk, task=build_task({"name": "arithmetic"}), seed=0, backlog=1).top_up()
    release = threading.Event()
    held = [asyncio.wrap_future(dbthreads.executor().submit(release.wait)) for _ in range(dbthreads.size())]
    try:
        await comm.send_json_to({"type": "lease_request", "job_id": job.pk, "groups": 1, "id": "l1"})
        assert await comm.receive_nothing(timeout=0.2)  # it waits for the job's read
        closing = asyncio.create_task(comm.disconnect(timeout=15))
        await asyncio.wait_for(closing_seen.wait(), timeout=10)  # the close reached the consumer
    finally:
        release.set()
        await asyncio.gather(*held)
    await closing
    assert redis_client.xpending(prompts_key(job.pk), PROMPT_GROUP)["pending"] == 1  # the lease was made
    assert comm.output_queue.empty()  # and its reply not sent
