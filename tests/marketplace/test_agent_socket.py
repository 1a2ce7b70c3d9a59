"""The agent websocket over the real ASGI app (Channels communicator, real Redis channel layer)."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from dataplane import replay
from dataplane.groupcodec import decode_group
from dataplane.tasks import build_task
from echo2_site.asgi import application
from learner.prompts import PromptFeeder
from marketplace import services
from marketplace.models import Job, Worker

from ..groups import stream_entries
from ..statements import Statements
from . import factories

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("redis_url")]


async def connect(key: str | None) -> WebsocketCommunicator:
    headers = [(b"authorization", f"Bearer {key}".encode())] if key else []
    comm = WebsocketCommunicator(application, "/ws/agent/", headers=headers)
    connected, _ = await comm.connect(timeout=10)  # the first connect of a test run opens the database threads
    assert connected
    return comm


async def started_with(comm: WebsocketCommunicator, job) -> dict:
    """Say hello, start ``job`` and return the assignment it pushes to this (idle) worker."""
    await comm.send_json_to({"type": "hello", "agent_version": "test"})
    assert (await comm.receive_json_from(timeout=10))["type"] == "welcome"  # a loaded machine: not the 1 s default
    await database_sync_to_async(services.job_start)(job=await database_sync_to_async(Job.objects.get)(pk=job.pk))
    assign = await comm.receive_json_from(timeout=5)
    assert assign["type"] == "assign"
    return assign


def record(job_id: int, lease: dict, **overrides) -> dict:
    return {"job_id": job_id, "lease_id": lease["lease_id"], "group_id": lease["group_id"], "prompt": lease["prompt"],
            "prompt_ids": [1, 5, 6], "completion": "7", "completion_ids": [12, 2], "logprobs": [-1.5, -0.2],
            "reward": 1.0, "version": 0, **overrides}


def group(job_id: int, lease: dict, records: list[dict], version: int = 0) -> dict:
    """A ``trajectories`` message as the agent sends it: one group of records."""
    return {"type": "trajectories", "group": {"job_id": job_id, "lease_id": lease["lease_id"],
                                              "group_id": lease["group_id"], "version": version, "records": records}}


@pytest.fixture
def settings_eager(settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    return settings


@database_sync_to_async
def setup_job_and_worker(**job_fields):
    owner, provider = factories.user(), factories.user()
    worker, key = factories.worker(provider)
    job = factories.job(owner, **{"batch_trajectories": 8, "group_size": 4, **job_fields})
    return job, worker, key


async def test_unknown_key_is_rejected_and_closed():
    comm = await connect("e2w_wrong")
    reply = await comm.receive_json_from()
    assert reply == {"type": "rejected", "reason": "unknown or missing agent key", "ref": None, "ref_id": None,
                     "retry_after": None}
    assert (await comm.receive_output())["code"] == 4401
    anonymous = await connect(None)
    assert (await anonymous.receive_json_from())["type"] == "rejected"


async def test_malformed_frames_get_reasons_and_the_session_survives(settings_eager):
    _, worker, key = await setup_job_and_worker()
    comm = await connect(key)
    await comm.send_to(text_data="{not json")
    assert (await comm.receive_json_from())["reason"] == "frame is not valid JSON"
    await comm.send_json_to({"type": "dance"})
    assert (await comm.receive_json_from())["reason"] == "unknown message type 'dance'"
    await comm.send_json_to({"type": "lease_request", "job_id": "x"})
    reply = await comm.receive_json_from()
    assert reply["type"] == "rejected" and reply["ref"] == "lease_request" and "job_id" in reply["reason"]
    await comm.send_to(bytes_data=b"\x00")
    assert "binary" in (await comm.receive_json_from())["reason"]
    await comm.send_json_to({"type": "lease_request", "job_id": 999})
    assert (await comm.receive_json_from())["reason"] == "job_id: this worker is not active in job 999"
    await comm.send_json_to({"type": "hello", "agent_version": "test"})  # still alive after all that
    assert (await comm.receive_json_from(timeout=10))["type"] == "welcome"
    await comm.disconnect()
    assert (await database_sync_to_async(Worker.objects.get)(pk=worker.pk)).status == Worker.Status.OFFLINE


async def test_lease_submit_and_bad_records_lose_nothing(settings_eager, redis_client):
    job, worker, key = await setup_job_and_worker()
    comm = await connect(key)
    await comm.send_json_to({"type": "hello", "agent_version": "test"})
    assert (await comm.receive_json_from())["type"] == "welcome"

    await database_sync_to_async(services.job_start)(job=await database_sync_to_async(Job.objects.get)(pk=job.pk))
    assign = await comm.receive_json_from(timeout=5)
    assert assign["type"] == "assign" and assign["job_id"] == job.pk and assign["group_size"] == 4

    PromptFeeder(redis_client, job_id=job.pk, task=build_task({"name": "arithmetic"}), seed=0, backlog=2).top_up()
    await comm.send_json_to({"type": "lease_request", "job_id": job.pk, "groups": 2})
    lease = await comm.receive_json_from()
    assert lease["type"] == "lease" and len(lease["leases"]) == 2
    first, second = lease["leases"]

    # A group with one malformed record is refused whole, with the reason; the lease stays open.
    bad = [record(job.pk, first) for _ in range(3)] + [record(job.pk, first, logprobs=[-1.0])]
    await comm.send_json_to(group(job.pk, first, bad))
    reply = await comm.receive_json_from()
    assert reply["type"] == "rejected" and reply["ref"] == "trajectories"
    assert reply["reason"].startswith("trajectories.group.records.3: ")
    assert "logprobs has 1 entries for 2 completion tokens" in reply["reason"]
    assert redis_client.xlen(replay.trajectories_key(job.pk)) == 0
    # A record that names another lease breaks the group rules.
    mixed = [record(job.pk, first) for _ in range(3)] + [record(job.pk, second)]
    await comm.send_json_to(group(job.pk, first, mixed))
    assert "records.3.lease_id" in (await comm.receive_json_from())["reason"]

    # A version the learner never published is refused, and so is a group of the wrong size.
    future = [record(job.pk, second, version=5) for _ in range(4)]
    await comm.send_json_to(group(job.pk, second, future, version=5))
    assert "was never published" in (await comm.receive_json_from())["reasons"][0]
    await comm.send_json_to(group(job.pk, second, [record(job.pk, second)] * 3))
    assert "a group needs 4 records, got 3" in (await comm.receive_json_from())["reasons"][0]

    # The lease's group id with another prompt (a worker answering a question it chose) is refused.
    await comm.send_json_to(group(job.pk, first, [record(job.pk, first, prompt="1+1=") for _ in range(4)]))
    assert "differs from the leased prompt" in (await comm.receive_json_from())["reasons"][0]

    # The same lease answered correctly is accepted, stored exactly once: sent again, it is the stored group.
    good = [record(job.pk, first, reward=float(i % 2)) for i in range(4)]
    message = group(job.pk, first, good)
    await comm.send_json_to(message)
    assert (await comm.receive_json_from())["accepted"] == 4
    await comm.send_json_to(message)
    again = await comm.receive_json_from()
    assert again["accepted"] == 4 and again["reasons"] == []

    entries = stream_entries(redis_client, replay.trajectories_key(job.pk))
    assert len(entries) == 1 and entries[0][1]["lease_id"] == first["lease_id"]
    assert entries[0][1]["worker_id"] == str(worker.pk)  # stamped by the site, for the learner's audits
    stored = decode_group(entries[0][1]["data"])  # as the learner reads it
    assert [r.reward for r in stored.records] == [0.0, 1.0, 0.0, 1.0] and stored.version == 0
    counters = replay.ReplayBuffer(redis_client, job.pk).counters()
    assert counters["accepted_groups"] == 1 and counters["accepted_records"] == 4
    assert counters["rejected_records"] == 4 + 4 + 4 + 3 + 4  # malformed, mixed, unpublished, short, another prompt
    assert counters["resent_groups"] == 1
    # The refused second lease is still pending: it will be leased again, nothing is lost.
    assert redis_client.xpending(replay.prompts_key(job.pk), replay.PROMPT_GROUP)["pending"] == 1
    await comm.disconnect()


async def test_expired_lease_goes_to_another_worker(settings_eager, redis_client):
    settings_eager.ECHO2 = {**settings_eager.ECHO2, "LEASE_TIMEOUT_S": 0.0}
    job, worker, key = await setup_job_and_worker()
    other, other_key = await database_sync_to_async(factories.worker)(await database_sync_to_async(
        lambda: worker.provider.user)())
    comms = [await connect(key), await connect(other_key)]
    for comm in comms:
        await comm.send_json_to({"type": "hello", "agent_version": "test"})
        await comm.receive_json_from()
    await database_sync_to_async(services.job_start)(job=await database_sync_to_async(Job.objects.get)(pk=job.pk))
    for comm in comms:
        assert (await comm.receive_json_from(timeout=5))["type"] == "assign"
    PromptFeeder(redis_client, job_id=job.pk, task=build_task({"name": "arithmetic"}), seed=0, backlog=1).top_up()

    await comms[0].send_json_to({"type": "lease_request", "job_id": job.pk})
    stolen = (await comms[0].receive_json_from())["leases"][0]
    await comms[1].send_json_to({"type": "lease_request", "job_id": job.pk})
    reclaimed = (await comms[1].receive_json_from())["leases"][0]
    assert reclaimed["lease_id"] == stolen["lease_id"]  # timed out, handed to the next worker

    late = [record(job.pk, stolen) for _ in range(4)]
    await comms[0].send_json_to(group(job.pk, stolen, late))
    assert "another worker" in (await comms[0].receive_json_from())["reasons"][0]
    for comm in comms:
        await comm.disconnect()


async def started_with_version_1(comm: WebsocketCommunicator, job):
    """Say hello, start ``job``, publish its version 1 and take its push; returns a reader of the job as it is now."""
    await started_with(comm, job)
    fresh = database_sync_to_async(lambda: Job.objects.get(pk=job.pk))
    await database_sync_to_async(services.snapshot_publish)(job=await fresh(), version=1, url="http://l/v1/",
                                                            manifest=factories.manifest(job, 1))
    assert (await comm.receive_json_from(timeout=5))["type"] == "snapshot"
    return fresh


async def test_a_heartbeat_after_the_release_keeps_the_recorded_install(settings_eager):
    # Released, the agent's heartbeats carry no installed version; what it installed stays on record.
    job, worker, key = await setup_job_and_worker()
    comm = await connect(key)
    fresh = await started_with_version_1(comm, job)
    await comm.send_json_to({"type": "snapshot_installed", "job_id": job.pk, "version": 1, "seconds": 0.5})
    await comm.send_json_to({"type": "heartbeat", "throughput": 1.0, "installed_version": 1, "job_id": job.pk})
    await comm.send_json_to({"type": "lease_request", "job_id": job.pk})  # answered once both are handled
    assert (await comm.receive_json_from())["type"] == "no_work"
    await database_sync_to_async(services.job_finish)(job=await fresh(), status="completed")
    assert (await comm.receive_json_from(timeout=5))["type"] == "release"

    await comm.send_json_to({"type": "heartbeat", "throughput": 0.0, "installed_version": None})
    await comm.send_json_to({"type": "lease_request", "job_id": job.pk})
    assert (await comm.receive_json_from())["type"] == "rejected"  # the job is over
    assert (await database_sync_to_async(Worker.objects.get)(pk=worker.pk)).installed_version == 1
    assert (await database_sync_to_async(lambda: job.snapshots.get(version=1).installs)()) == 1
    await comm.disconnect()


async def test_install_reports_count_once_and_after_a_release_are_ignored_and_elsewhere_refused(settings_eager):
    # Checked against the process's shared read of the job, not the worker's rows: each must still say the truth.
    job, worker, key = await setup_job_and_worker()
    other = await database_sync_to_async(lambda: factories.job(factories.user()))()
    comm = await connect(key)
    fresh = await started_with_version_1(comm, job)
    for _ in range(2):
        await comm.send_json_to({"type": "snapshot_installed", "job_id": job.pk, "version": 1, "seconds": 0.5})
    await comm.send_json_to({"type": "snapshot_installed", "job_id": other.pk, "version": 1, "seconds": 0.5})
    refused = await comm.receive_json_from()
    assert refused["type"] == "rejected" and refused["ref"] == "snapshot_installed"
    assert f"not active in job {other.pk}" in refused["reason"]
    await database_sync_to_async(services.job_finish)(job=await fresh(), status="completed")
    assert (await comm.receive_json_from(timeout=5))["type"] == "release"
    await comm.send_json_to({"type": "snapshot_installed", "job_id": job.pk, "version": 2, "seconds": 0.5})  # late
    await comm.send_json_to({"type": "lease_request", "job_id": job.pk})  # answered once the report is handled
    assert (await comm.receive_json_from())["type"] == "rejected"  # the lease: the job is over; the report: silence
    snap = await database_sync_to_async(lambda: job.snapshots.get(version=1))()
    assert snap.installs == 1 and snap.t_bcast is not None
    await comm.disconnect()


async def test_a_released_workers_leases_go_back_at_once(settings_eager, redis_client):
    job, worker, key = await setup_job_and_worker()
    comm = await connect(key)
    await started_with(comm, job)
    PromptFeeder(redis_client, job_id=job.pk, task=build_task({"name": "arithmetic"}), seed=0, backlog=2).top_up()
    await comm.send_json_to({"type": "lease_request", "job_id": job.pk, "groups": 2})
    held = {x["lease_id"] for x in (await comm.receive_json_from())["leases"]}

    other, _ = await database_sync_to_async(factories.worker)(await database_sync_to_async(factories.user)())
    await database_sync_to_async(_release_all)(job.pk)
    assert (await comm.receive_json_from(timeout=5))["type"] == "release"
    # the lease timeout is 30 s, yet the next worker to ask gets both prompts now
    again = await database_sync_to_async(lambda: replay.ReplayBuffer(redis_client, job.pk).lease(
        worker_id=other.pk, count=2, timeout_s=30.0))()
    assert {x.lease_id for x in again} == held
    await comm.disconnect()


def _release_all(job_id: int) -> None:
    from marketplace.models import Activation

    for activation in Activation.objects.filter(job_id=job_id, ended_at=None):
        services.worker_release(activation=activation, reason="test")


async def test_an_agent_that_asks_gets_its_jobs_base_then_the_newest_snapshot(settings_eager, settings):
    settings.ECHO2 = {**settings.ECHO2, "AGENT_STATE_MAX_AGE_S": 3600.0}  # the socket's read is dropped by pushes only
    job, worker, key = await setup_job_and_worker()
    comm = await connect(key)
    await comm.send_json_to({"type": "hello", "agent_version": "test"})
    assert (await comm.receive_json_from(timeout=10))["type"] == "welcome"  # a loaded machine: not the 1 s default
    await database_sync_to_async(services.job_start)(job=await database_sync_to_async(Job.objects.get)(pk=job.pk))
    assert (await comm.receive_json_from(timeout=5))["base"] is None  # not published yet
    await comm.send_json_to({"type": "lease_request", "job_id": job.pk})  # the process reads the running job
    assert (await comm.receive_json_from())["type"] == "no_work"
    counted = Statements()
    await database_sync_to_async(counted.install)()
    try:  # nothing to give: no answer, and what a fleet polls until its learner publishes costs no query
        for which in ("base", "newest"):
            await comm.send_json_to({"type": "snapshot_request", "job_id": job.pk, "which": which})
        await comm.send_json_to({"type": "lease_request", "job_id": job.pk})
        assert (await comm.receive_json_from())["type"] == "no_work"
    finally:
        await database_sync_to_async(counted.uninstall)()
    assert counted.count == 0

    fresh = database_sync_to_async(lambda: Job.objects.get(pk=job.pk))
    from dataplane.snapshot import build_manifest

    base = build_manifest(b"base", job_id=job.pk, version=0, format="checkpoint-tar").model_dump(mode="json")
    await database_sync_to_async(services.snapshot_publish)(job=await fresh(), version=0, url="http://l/v0/",
                                                            manifest=base)
    assert (await comm.receive_json_from(timeout=5))["version"] == 0  # pushed to the active worker
    await database_sync_to_async(services.snapshot_publish)(job=await fresh(), version=1, url="http://l/v1/",
                                                            manifest=factories.manifest(job, 1))
    assert (await comm.receive_json_from(timeout=5))["version"] == 1
    for which, version in (("base", 0), ("newest", 1)):
        await comm.send_json_to({"type": "snapshot_request", "job_id": job.pk, "which": which})
        reply = await comm.receive_json_from()
        assert (reply["type"], reply["version"], reply["parent"]) == ("snapshot", version, None)
    await comm.disconnect()


async def test_every_reply_names_the_request_it_answers(settings_eager, redis_client):
    job, worker, key = await setup_job_and_worker()
    comm = await connect(key)
    await started_with(comm, job)
    await comm.send_json_to({"type": "lease_request", "job_id": job.pk, "id": "r7"})
    assert (await comm.receive_json_from()) | {"retry_after": 0} == {"type": "no_work", "job_id": job.pk,
                                                                     "retry_after": 0, "ref_id": "r7"}
    await comm.send_json_to({"type": "lease_request", "job_id": 999, "id": "r8"})  # refused by the service
    assert (await comm.receive_json_from())["ref_id"] == "r8"
    await comm.send_json_to({"type": "lease_request", "job_id": "x", "id": "r9"})  # refused by the schema
    refused = await comm.receive_json_from()
    assert (refused["type"], refused["ref_id"]) == ("rejected", "r9")
    await comm.disconnect()
