"""The agent socket's hot path over the real ASGI app and Redis: the running job each socket holds is
dropped by the pushes that change it, and groups sent without waiting for replies are each answered and counted."""

from __future__ import annotations

import time

import pytest
from channels.db import database_sync_to_async

from dataplane import replay
from dataplane.tasks import build_task
from learner.prompts import PromptFeeder
from marketplace import services
from marketplace.infra import telemetry
from marketplace.models import Job

from . import factories
from .test_agent_socket import connect, group, record, setup_job_and_worker, started_with

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("redis_url")]


@pytest.fixture
def long_lived_state(settings):
    """Eager Celery, and a socket state that would outlive the test: only a push can make it read again."""
    settings.CELERY_TASK_ALWAYS_EAGER = True
    settings.ECHO2 = {**settings.ECHO2, "AGENT_STATE_MAX_AGE_S": 3600.0}
    return settings


async def leased(comm, redis_client, job, groups: int) -> list[dict]:
    PromptFeeder(redis_client, job_id=job.pk, task=build_task({"name": "arithmetic"}), seed=0,
                 backlog=groups).top_up()
    await comm.send_json_to({"type": "lease_request", "job_id": job.pk, "groups": groups, "id": "lease-1"})
    lease = await comm.receive_json_from()
    assert lease["type"] == "lease" and len(lease["leases"]) == groups
    return lease["leases"]


fresh = database_sync_to_async(lambda pk: Job.objects.get(pk=pk))


async def test_after_a_release_the_next_group_is_refused(long_lived_state, redis_client):
    job, _, key = await setup_job_and_worker()
    comm = await connect(key)
    await started_with(comm, job)
    first, second = await leased(comm, redis_client, job, 2)  # the socket now holds the running job
    await comm.send_json_to(group(job.pk, first, [record(job.pk, first) for _ in range(4)]))
    assert (await comm.receive_json_from())["accepted"] == 4

    await database_sync_to_async(services.job_pause)(job=await fresh(job.pk))
    assert (await comm.receive_json_from(timeout=5))["type"] == "release"
    await comm.send_json_to(group(job.pk, second, [record(job.pk, second) for _ in range(4)]))
    refused = await comm.receive_json_from()
    assert refused["type"] == "rejected"
    assert refused["reason"] == f"job_id: job {job.pk} is paused; this worker was released from it"
    assert replay.ReplayBuffer(redis_client, job.pk).counters()["accepted_records"] == 4
    await comm.disconnect()


async def test_after_a_snapshot_is_published_its_version_is_accepted(long_lived_state, redis_client):
    job, _, key = await setup_job_and_worker()
    comm = await connect(key)
    await started_with(comm, job)
    first, second = await leased(comm, redis_client, job, 2)  # held: published version 0
    ahead = [record(job.pk, first, version=1) for _ in range(4)]
    await comm.send_json_to(group(job.pk, first, ahead, version=1))
    assert "was never published" in (await comm.receive_json_from())["reasons"][0]

    await database_sync_to_async(services.snapshot_publish)(job=await fresh(job.pk), version=1, url="http://l/v1/",
                                                            manifest=factories.manifest(job, 1))
    assert (await comm.receive_json_from(timeout=5))["type"] == "snapshot"
    await comm.send_json_to(group(job.pk, second, [record(job.pk, second, version=1) for _ in range(4)], version=1))
    assert (await comm.receive_json_from())["accepted"] == 4
    await comm.disconnect()


async def test_the_state_is_read_again_after_its_max_age(settings, redis_client):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    settings.ECHO2 = {**settings.ECHO2, "AGENT_STATE_MAX_AGE_S": 0.2}
    job, _, key = await setup_job_and_worker()
    comm = await connect(key)
    await started_with(comm, job)
    (only,) = await leased(comm, redis_client, job, 1)
    # Published behind the socket's back (no push): seen once the held state is older than its max age.
    await database_sync_to_async(lambda: Job.objects.filter(pk=job.pk).update(published_version=1))()
    time.sleep(0.3)
    await comm.send_json_to(group(job.pk, only, [record(job.pk, only, version=1) for _ in range(4)], version=1))
    assert (await comm.receive_json_from())["accepted"] == 4
    await comm.disconnect()


async def test_groups_sent_without_waiting_are_each_answered_and_counted_once(long_lived_state, redis_client):
    job, worker, key = await setup_job_and_worker(batch_trajectories=12)  # 3 groups a step: a lease of 3
    comm = await connect(key)
    await started_with(comm, job)
    leases = await leased(comm, redis_client, job, 3)
    for i, lease in enumerate(leases):
        await comm.send_json_to({**group(job.pk, lease, [record(job.pk, lease) for _ in range(4)]), "id": f"g{i}"})
    await comm.send_json_to({**group(job.pk, leases[0], [record(job.pk, leases[0]) for _ in range(4)]), "id": "again"})
    replies = {}
    for _ in range(4):
        reply = await comm.receive_json_from()
        replies[reply["ref_id"]] = reply
    assert [replies[f"g{i}"]["accepted"] for i in range(3)] == [4, 4, 4]
    assert replies["again"]["accepted"] == 4  # the group stored already: told so again, not stored twice
    assert replay.ReplayBuffer(redis_client, job.pk).counters()["accepted_records"] == 12
    events = telemetry.recent_accepted([worker.pk], job_id=job.pk, now=time.time())[worker.pk]
    assert [n for _, n in events] == [4, 4, 4]  # the measured mu_i's evidence, added with each group
    await comm.disconnect()


async def test_a_group_parsed_from_its_text_still_keeps_the_nesting_limit(long_lived_state, redis_client):
    job, _, key = await setup_job_and_worker()
    comm = await connect(key)
    await started_with(comm, job)
    (only,) = await leased(comm, redis_client, job, 1)
    deep: dict = {}
    node = deep
    for _ in range(40):  # valid for the schema (metadata is free-form), too deep for the site
        node["x"] = {}
        node = node["x"]
    await comm.send_json_to(group(job.pk, only, [record(job.pk, only, metadata=deep) for _ in range(4)]))
    reply = await comm.receive_json_from()
    assert reply["type"] == "rejected" and "nested deeper than" in reply["reason"]
    shallow = {"task": {"level": 1}}
    await comm.send_json_to(group(job.pk, only, [record(job.pk, only, metadata=shallow) for _ in range(4)]))
    assert (await comm.receive_json_from())["accepted"] == 4
    await comm.disconnect()


async def test_the_sockets_of_one_job_share_one_read_of_it(long_lived_state, redis_client, monkeypatch):
    """Two workers' sockets, each asking for work: the job (and who is active in it) is read once for both."""
    job, _, key = await setup_job_and_worker(batch_trajectories=16)
    provider = await database_sync_to_async(factories.user)()
    _, other_key = await database_sync_to_async(factories.worker)(provider)
    comms = [await connect(key), await connect(other_key)]
    for comm in comms:
        await comm.send_json_to({"type": "hello", "agent_version": "test"})
        assert (await comm.receive_json_from(timeout=10))["type"] == "welcome"
    await database_sync_to_async(services.job_start)(job=await fresh(job.pk))
    for comm in comms:
        assert (await comm.receive_json_from(timeout=5))["type"] == "assign"
    reads = []
    real = services.job_at_work
    monkeypatch.setattr(services, "job_at_work", lambda **kw: reads.append(kw) or real(**kw))
    PromptFeeder(redis_client, job_id=job.pk, task=build_task({"name": "arithmetic"}), seed=0, backlog=4).top_up()
    for i, comm in enumerate(comms):
        await comm.send_json_to({"type": "lease_request", "job_id": job.pk, "groups": 1, "id": f"l{i}"})
        assert (await comm.receive_json_from(timeout=5))["type"] == "lease"
    assert reads == [{"job_id": job.pk}]
    for comm in comms:
        await comm.disconnect()
