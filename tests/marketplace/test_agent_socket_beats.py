"""A socket's heartbeats, and their database reports, on tasks of their own (marketplace/realtime/lane.py
``Newest``): one at a time, the newest waiting replacing an older one; never in the way of the socket's next frames
and pushes while a heartbeat's Redis call runs, nor of the next heartbeat while a report waits for the database."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from channels.layers import get_channel_layer

from marketplace import services
from marketplace.realtime.lane import Newest

from .test_agent_socket import connect, settings_eager, setup_job_and_worker, started_with  # noqa: F401


async def test_newest_runs_one_at_a_time_and_what_waits_is_replaced_by_what_comes_after(caplog):
    newest = Newest("beats")
    ran, gate = [], asyncio.Event()

    def work(name: str, *, fail: bool = False):
        async def run() -> None:
            ran.append(name)
            if name == "first":
                await gate.wait()
            if fail:
                raise RuntimeError("a bug")

        return run

    newest.put(work("first"))
    await asyncio.sleep(0)
    newest.put(work("second"))
    newest.put(work("third", fail=True))  # replaces the second, which never runs
    newest.put(work("fourth"))  # replaces the third
    await asyncio.sleep(0)
    assert ran == ["first"]
    gate.set()
    await newest.close(5)
    assert ran == ["first", "fourth"] and newest.replaced == 2
    newest.put(work("fifth", fail=True))
    await asyncio.sleep(0)  # it ran, and failed
    newest.put(work("sixth"))  # one's bug does not stop the next
    await newest.close(5)
    assert ran[-2:] == ["fifth", "sixth"] and "beats: a request failed" in caplog.text


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("redis_url", "settings_eager")
async def test_a_push_is_sent_while_the_sockets_heartbeat_waits_on_redis(monkeypatch):
    """A heartbeat's Redis call held: the push that comes after it is sent at once (handled where it arrived, the
    heartbeat held the socket's next frames and pushes for its call). Released, the heartbeat is recorded."""
    job, worker, key = await setup_job_and_worker()
    comm = await connect(key)
    await started_with(comm, job)
    real, gate, calls = services.worker_heartbeats_record_async, asyncio.Event(), []

    async def held(beats):
        calls.append(beats)
        await gate.wait()
        return await real(beats)

    monkeypatch.setattr(services, "worker_heartbeats_record_async", held)
    await comm.send_to(text_data=json.dumps({"type": "heartbeat", "throughput": 1.0, "state": "idle"}))
    for _ in range(100):  # until the heartbeat's call began (a safety limit: it begins at once)
        if calls:
            break
        await asyncio.sleep(0.02)
    await get_channel_layer().group_send(services.worker_group(worker.pk), {
        "type": "agent.message", "message": {"type": "no_work", "job_id": job.pk, "retry_after": 0.5}})
    pushed = await comm.receive_json_from(timeout=5)
    assert pushed["type"] == "no_work" and not gate.is_set() and len(calls) == 1
    gate.set()
    await comm.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("redis_url", "settings_eager")
async def test_a_heartbeat_is_recorded_while_the_one_before_waits_for_its_database_report(monkeypatch):
    """The first heartbeat's database report held (the socket's database threads busy): the next heartbeat is still
    written to Redis at once, and a request sent after both is answered only once the report is in."""
    job, worker, key = await setup_job_and_worker()
    comm = await connect(key)
    await started_with(comm, job)
    real_record, real_apply = services.worker_heartbeats_record_async, services.worker_heartbeat_apply
    recorded, reports, held = [], [], threading.Event()

    async def record(beats):
        recorded.extend(beats)
        return await real_record(beats)

    def apply(**kwargs):
        reports.append(kwargs["state"])
        held.wait(10)
        return real_apply(**kwargs)

    monkeypatch.setattr(services, "worker_heartbeats_record_async", record)
    monkeypatch.setattr(services, "worker_heartbeat_apply", apply)
    beat = {"type": "heartbeat", "throughput": 1.0, "state": "generating", "job_id": job.pk}
    await comm.send_json_to(beat)  # a state the site never heard: it goes to the database
    await comm.send_json_to(beat)
    await comm.send_json_to({"type": "lease_request", "job_id": job.pk, "id": "after-the-beats"})
    for _ in range(250):  # until both are in Redis (a safety limit: at once)
        if len(recorded) == 2:
            break
        await asyncio.sleep(0.02)
    assert len(recorded) == 2 and reports == ["generating"] and not held.is_set()
    assert await comm.receive_nothing(timeout=0.3)  # the lease request waits for the report
    held.set()
    reply = await comm.receive_json_from(timeout=10)
    assert reply["ref_id"] == "after-the-beats" and reports == ["generating"]
    await comm.disconnect()
