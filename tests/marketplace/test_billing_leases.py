"""Bills follow leases, not recency: per fault, the worker-seconds billed against the seconds the worker held an
outstanding lease, over the real consumer (Channels communicator, real Redis, real clock). Before, "generating" held
for the lease timeout after the last lease or accepted group whether or not a lease was outstanding, a closed socket
marked the activation idle and the next expiry beat turned it back to generating."""

from __future__ import annotations

import asyncio
import time

import pytest
from channels.db import database_sync_to_async

from dataplane.tasks import build_task
from learner.prompts import PromptFeeder
from marketplace import services
from marketplace.infra import telemetry
from marketplace.services import presence

from .test_agent_socket import connect, settings_eager, setup_job_and_worker, started_with  # noqa: F401
from .test_agent_socket_budget import submit
from .test_agent_socket_parts import answer
from .test_billing import billed

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("redis_url", "settings_eager")]
TOLERANCE_S = 0.5  # between the test's clock readings and the site's, on a loaded machine


async def working(redis_client, prompts: int = 1):
    """A started job whose worker has installed its base and holds one lease: (job, comm, lease, leased at)."""
    job, comm, lease, before, _ = await working_keyed(redis_client, prompts)
    return job, comm, lease, before


async def working_keyed(redis_client, prompts: int = 1):
    """:func:`working`, and the worker's agent key (to connect again): (job, comm, lease, leased at, key)."""
    job, worker, key = await setup_job_and_worker()
    comm = await connect(key)
    await started_with(comm, job)
    started = (await billed(job.pk)).started_at.timestamp()
    telemetry.record_observed(worker.pk, job_id=job.pk, what="installed", at=max(time.time(), started + 0.001))
    PromptFeeder(redis_client, job_id=job.pk, task=build_task({"name": "arithmetic"}), seed=0,
                 backlog=prompts).top_up()
    await comm.send_to(text_data=submit(job.pk, "l1", lease=1))
    before = time.time()
    lease = (await comm.receive_json_from(timeout=5))["lease"]["leases"][0]
    return job, comm, lease, before, key


async def hello_again(key: str):
    """The agent on a new socket (another site process), welcomed."""
    again = await connect(key)
    await again.send_json_to({"type": "hello", "agent_version": "test"})
    assert (await again.receive_json_from(timeout=10))["type"] == "welcome"
    return again


beat = database_sync_to_async(lambda: presence.activations_release_silent())


async def test_billing_ends_when_the_last_group_is_accepted_not_a_hold_after_it(redis_client):
    """The learner is gone: the prompts run out. The worker returns its group and gets no more work; it is billed
    the seconds it held its lease, not the lease timeout after its last group."""
    job, comm, lease, leased_at = await working(redis_client)
    await asyncio.sleep(1.0)
    await beat()  # an expiry beat while it holds the lease: generating, from the lease
    await asyncio.sleep(1.0)
    returned_at = time.time()
    await comm.send_to(text_data=submit(job.pk, "l2", [answer(job.pk, lease, tokens=4)], lease=1))
    reply = await comm.receive_json_from(timeout=5)
    assert reply["results"][0]["accepted"] == 4 and reply["lease"]["type"] == "no_work"
    await asyncio.sleep(2.0)
    await beat()
    await beat()
    row = await billed(job.pk)
    assert row.state == "idle"
    assert row.billed_seconds == pytest.approx(returned_at - leased_at, abs=TOLERANCE_S)
    await comm.disconnect()


async def test_a_closed_socket_stops_the_bill_at_once_and_no_beat_turns_it_back(redis_client):
    """The agent is killed while it holds a lease: its socket closes. Billed up to the close; expiry beats after it
    bill nothing more (one used to turn it back to generating until the lease timeout)."""
    job, comm, _, leased_at = await working(redis_client)
    await asyncio.sleep(1.0)
    await beat()
    await asyncio.sleep(0.5)
    closed_at = time.time()
    await comm.disconnect()
    await database_sync_to_async(services.worker_closes_record)()
    for _ in range(3):
        await asyncio.sleep(0.5)
        await beat()
    row = await billed(job.pk)
    assert row.state == "idle"
    assert row.billed_seconds == pytest.approx(closed_at - leased_at, abs=TOLERANCE_S)


async def test_a_lease_left_unanswered_is_billed_until_its_timeout_then_nothing(settings, redis_client):
    """The agent froze with its socket open: its lease is held until the lease timeout, then goes to anyone; the
    bill stops there, whatever the socket does after."""
    settings.ECHO2 = {**settings.ECHO2, "LEASE_TIMEOUT_S": 1.5}
    job, comm, _, leased_at = await working(redis_client)
    await asyncio.sleep(0.5)
    await beat()
    await asyncio.sleep(3.0)
    await beat()
    row = await billed(job.pk)
    assert row.state == "idle"
    assert row.billed_seconds == pytest.approx(1.5, abs=TOLERANCE_S)
    await comm.disconnect()


async def test_a_wait_for_work_between_two_leases_is_not_billed(redis_client):
    """Between two reports the worker returns its group, finds no work (the learner is behind), waits and leases
    again: billed the two leases' seconds, not the wait between them (the bill used to take the state seen at the
    report before for the whole interval)."""
    job, comm, lease, leased_at = await working(redis_client)
    await asyncio.sleep(1.0)
    await beat()  # generating, from the lease
    await asyncio.sleep(0.5)
    returned_at = time.time()
    await comm.send_to(text_data=submit(job.pk, "l2", [answer(job.pk, lease, tokens=4)], lease=1))
    assert (await comm.receive_json_from(timeout=5))["lease"]["type"] == "no_work"
    await asyncio.sleep(2.0)  # no lease held: the wait
    feeder = PromptFeeder(redis_client, job_id=job.pk, task=build_task({"name": "arithmetic"}), seed=1, backlog=1)
    feeder.top_up(trained=1)  # the learner trained the first group: one more prompt
    await comm.send_to(text_data=submit(job.pk, "l3", lease=1))
    second_at = time.time()
    second = (await comm.receive_json_from(timeout=5))["lease"]["leases"][0]
    await asyncio.sleep(1.0)
    ended_at = time.time()
    await comm.send_to(text_data=submit(job.pk, "l4", [answer(job.pk, second, tokens=4)], lease=1))
    assert (await comm.receive_json_from(timeout=5))["results"][0]["accepted"] == 4
    await asyncio.sleep(0.5)
    await beat()  # one report for the whole interval: lease, wait, lease
    row = await billed(job.pk)
    assert row.state == "idle"
    held = (returned_at - leased_at) + (ended_at - second_at)
    assert row.billed_seconds == pytest.approx(held, abs=TOLERANCE_S)
    await comm.disconnect()


async def test_a_frozen_agent_is_billed_nothing_after_its_last_heartbeat(settings, redis_client):
    """The agent froze holding a lease, its socket open: beats bill the lease while the site still thinks it alive;
    once expiry finds it silent past the worker timeout, what was billed after its last heartbeat is given back
    (a frozen agent used to keep the bill of its lease until the lease timeout)."""
    settings.ECHO2 = {**settings.ECHO2, "WORKER_TIMEOUT_S": 2.0, "LEASE_TIMEOUT_S": 30.0}
    job, comm, _, leased_at = await working(redis_client)
    await asyncio.sleep(0.5)
    await comm.send_json_to({"type": "heartbeat", "job_id": job.pk, "state": "generating"})
    await asyncio.sleep(0.5)  # its last heartbeat: handled by now
    last_beat = time.time() - 0.5
    for _ in range(3):  # frozen: no heartbeat, the lease outstanding; the beats bill it meanwhile
        await asyncio.sleep(1.0)
        await beat()
    assert (await billed(job.pk)).billed_seconds > last_beat - leased_at + 1.0
    await asyncio.sleep(1.5)  # the release after the expiry must not bill its lease again up to the release
    await database_sync_to_async(services.expire_silent_workers)()
    row = await billed(job.pk)
    assert row.ended_at is not None
    assert row.billed_seconds == pytest.approx(last_beat - leased_at, abs=TOLERANCE_S)
    await comm.disconnect()


async def test_a_site_process_that_died_never_bills_the_time_until_its_agent_says_hello_again(redis_client):
    """The site process holding the socket was killed: the close never reached the site, so the beats kept billing
    the worker's pending lease as if the socket were open. The agent's hello on a new socket ends the old session at
    its last heartbeat, and what was billed after it is given back (1.7 worker-seconds in the fault suite's
    site-restart row before)."""
    job, comm, _, leased_at, key = await working_keyed(redis_client)
    await asyncio.sleep(0.5)
    await comm.send_json_to({"type": "heartbeat", "job_id": job.pk, "state": "generating"})
    await asyncio.sleep(0.5)  # its last heartbeat on the old socket: handled by now
    last_beat = time.time() - 0.5
    for _ in range(3):  # the site process is gone: nobody records the close; the beats bill the pending lease
        await asyncio.sleep(0.7)
        await beat()
    assert (await billed(job.pk)).billed_seconds > last_beat - leased_at + 1.0
    again = await hello_again(key)
    row = await billed(job.pk)
    assert row.billed_seconds == pytest.approx(last_beat - leased_at, abs=TOLERANCE_S)
    await again.disconnect()


async def test_after_a_lost_socket_the_time_up_to_its_last_heartbeat_is_billed_lease_by_lease(redis_client):
    """The worker returned its group after the last fold and held no lease; then its site process died. The
    hello on a new socket bills up to the last heartbeat by the leases the site saw, not in the state of that fold
    (which billed the time after the group as generating, up to the heartbeat)."""
    job, comm, lease, leased_at, key = await working_keyed(redis_client)
    await comm.send_json_to({"type": "heartbeat", "job_id": job.pk, "state": "generating"})  # reported: new state
    await asyncio.sleep(0.5)
    await beat()  # the last fold: generating, from the lease; the heartbeats leave the reports to it from here
    await asyncio.sleep(0.5)
    returned_at = time.time()
    await comm.send_to(text_data=submit(job.pk, "l2", [answer(job.pk, lease, tokens=4)]))
    assert (await comm.receive_json_from(timeout=5))["results"][0]["accepted"] == 4
    await asyncio.sleep(2.0)  # holding no lease (not asking for one yet)
    await comm.send_json_to({"type": "heartbeat", "job_id": job.pk, "state": "generating"})  # stays in Redis
    await asyncio.sleep(0.5)  # its last heartbeat on the old socket; then the process holding it is gone
    again = await hello_again(key)
    row = await billed(job.pk)
    assert row.billed_seconds == pytest.approx(returned_at - leased_at, abs=TOLERANCE_S)
    await again.disconnect()
