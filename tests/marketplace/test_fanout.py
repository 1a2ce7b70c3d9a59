"""Publication at fleet size: one event per publication to the job's agents group, each agent socket
building its own worker's message, over the real ASGI app and a real Redis channel layer."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from decimal import Decimal

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer

from dataplane import credentials
from dataplane import messages as m
from dataplane.snapshot import build_manifest, manifest_reference
from marketplace import services
from marketplace.infra import telemetry
from marketplace.models import Activation, Job, Worker
from marketplace.realtime import channel_layer
from marketplace.services import fanout

from . import factories
from .test_agent_socket import connect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("redis_url")]

LEARNER_RELAY = "10.0.0.1:7000"


@pytest.fixture
def eager(settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    return settings


@database_sync_to_async
def relay_workers(n: int) -> tuple[list[Worker], list[str]]:
    provider = factories.user()
    made = [factories.worker(provider) for _ in range(n)]
    for i, (worker, _) in enumerate(made):
        Worker.objects.filter(pk=worker.pk).update(relay_address=f"10.0.1.{i + 1}:7001")
    return [w for w, _ in made], [key for _, key in made]


@database_sync_to_async
def chain_job() -> Job:
    """A job whose snapshots travel down one relay chain (B0 = each worker's registered bandwidth)."""
    job = factories.job(factories.user(), learner_uplink_bps=12_500_000)
    return job


@database_sync_to_async
def start(job: Job) -> Job:
    services.job_start(job=Job.objects.get(pk=job.pk))
    Job.objects.filter(pk=job.pk).update(learner_relay=LEARNER_RELAY)
    return Job.objects.get(pk=job.pk)


@database_sync_to_async
def publish(job: Job, version: int, *, url: str | None = None) -> None:
    services.snapshot_publish(job=Job.objects.get(pk=job.pk), version=version, url=url or f"http://l/v{version}/",
                              manifest=factories.manifest(job, version))


async def assigned(keys: list[str], job: Job) -> list:
    """Sockets of ``keys``' workers, each said hello and took its assignment to ``job``."""
    comms = [await connect(key) for key in keys]
    for comm in comms:
        await comm.send_json_to({"type": "hello", "agent_version": "test"})
        assert (await comm.receive_json_from())["type"] == "welcome"
    await start(job)
    for comm in comms:
        assert (await comm.receive_json_from(timeout=5))["type"] == "assign"
    return comms


async def test_a_published_snapshot_reaches_every_assigned_socket_with_its_own_credential_and_route(eager):
    workers, keys = await relay_workers(4)
    job = await chain_job()
    comms = await assigned(keys, job)
    outsider = workers[3]
    activation = await database_sync_to_async(Activation.objects.get)(worker_id=outsider.pk, ended_at=None)
    await database_sync_to_async(services.worker_release)(activation=activation, reason="test")
    assert (await comms[3].receive_json_from(timeout=5))["type"] == "release"  # and its socket leaves the group

    before = time.time()
    await publish(job, 1)
    got = {w.pk: m.SnapshotAvailable.model_validate(await comm.receive_json_from(timeout=5))
           for w, comm in zip(workers[:3], comms[:3], strict=True)}
    assert await comms[3].receive_nothing(timeout=0.3)  # a worker not in the job gets nothing
    (chain,) = (await database_sync_to_async(telemetry.load_chain_plan)(job.pk, 1)).chains
    assert sorted(chain) == sorted(got)
    addresses = {w.pk: f"10.0.1.{i + 1}:7001" for i, w in enumerate(workers)}
    for i, worker_id in enumerate(chain):
        msg = got[worker_id]
        parent = chain[i - 1] if i else None
        assert (msg.version, msg.url, msg.parent_worker_id) == (1, "http://l/v1/", parent)
        assert msg.parent == (addresses[parent] if parent else LEARNER_RELAY)
        grant = credentials.verify(job.transfer_secret, msg.credential, job_id=job.pk, version=1, now=time.time(),
                                   worker_id=worker_id)  # its own credential, no other worker's
        assert grant.expires > before
        child = chain[i + 1] if i + 1 < len(chain) else None
        assert msg.children == ([child] if child else [])
        # A relay parent learns only its child's fingerprint, never a credential.
        assert msg.child_credential_sha256 == ({child: credentials.fingerprint(got[child].credential)} if child else {})
        assert (msg.manifest_sha256, msg.manifest_bytes) == manifest_reference(factories.manifest(job, 1))
    for comm in comms:
        await comm.disconnect()


async def test_a_re_announced_version_is_sent_again_from_its_new_address(eager):
    # A restarted learner announces its newest version again from a new port: every process reads it afresh.
    _, keys = await relay_workers(2)
    job = await chain_job()
    comms = await assigned(keys, job)
    await publish(job, 1, url="http://old/v1/")
    assert {(await c.receive_json_from(timeout=5))["url"] for c in comms} == {"http://old/v1/"}
    await publish(job, 1, url="http://new/v1/")
    assert {(await c.receive_json_from(timeout=5))["url"] for c in comms} == {"http://new/v1/"}
    for comm in comms:
        await comm.disconnect()


def test_the_publish_request_sends_one_event_and_makes_the_same_queries_whatever_the_fleet(
        redis_url, monkeypatch, django_capture_on_commit_callbacks, django_assert_max_num_queries):
    sends: Counter = Counter()
    layer = get_channel_layer()
    real_send = layer.group_send

    async def counted(group, message):
        sends[group.split(".")[0] if group.startswith("worker.") else group] += 1
        await real_send(group, message)

    monkeypatch.setattr(layer, "group_send", counted)
    queries = []
    for n in (3, 30):
        provider = factories.user()
        job = factories.job(factories.user(), learner_uplink_bps=2_000)
        services.job_start(job=job)
        for i in range(n):
            worker, _ = services.worker_register(user=provider, name=f"w{n}-{i}", gpu="g", bandwidth_bps=1000,
                                                 price_per_hour=Decimal("0.1"), relay_address=f"10.0.2.{i}:7001")
            services.worker_activate(worker=worker, job=job)
        Job.objects.filter(pk=job.pk).update(learner_relay=LEARNER_RELAY)
        sends.clear()
        with django_assert_max_num_queries(50) as captured, django_capture_on_commit_callbacks(execute=True):
            snap = services.snapshot_publish(job=Job.objects.get(pk=job.pk), version=1, url="http://l/v1/",
                                             manifest=factories.manifest(job, 1))
        assert snap.n_chains == 2
        # One event for the agents, one for the job's pages: nothing per worker.
        assert sends == {fanout.agents_group(job.pk): 1, services.base.job_group(job.pk): 1}
        queries.append(len(captured.captured_queries))
    assert queries[0] == queries[1]  # no query per worker (no credential written, no deferred field loaded)


async def test_a_snapshot_published_while_the_assignment_travels_is_sent_once_the_socket_joins(eager):
    # The assignment was written before version 1 was published, and its socket joins the job's group only
    # once it has forwarded that assignment: the event went by meanwhile. Joining catches up with it.
    workers, keys = await relay_workers(1)
    job = await chain_job()
    (comm,) = await assigned(keys, job)
    await comm.disconnect()
    await database_sync_to_async(Worker.objects.filter(pk=workers[0].pk).update)(status=Worker.Status.ACTIVE)
    await publish(job, 1)
    layer = get_channel_layer()
    follower = fanout.JobFollower(layer, await layer.new_channel(), workers[0].pk)
    text = await follower.follow({"type": "assign", "job_id": job.pk, "base": None, "snapshot": None})
    caught_up = m.SnapshotAvailable.model_validate_json(text)
    assert (caught_up.version, caught_up.parent) == (1, LEARNER_RELAY)
    credentials.verify(job.transfer_secret, caught_up.credential, job_id=job.pk, version=1, now=time.time(),
                       worker_id=workers[0].pk)
    nonce = fanout.latest_announced(job.pk)[1]
    assert not follower.wants({"job_id": job.pk, "nonce": nonce})  # the event, if it crossed the join: not twice
    assert await follower.follow({"type": "assign", "job_id": job.pk, "base": None, "snapshot": {"version": 1}}) \
        is None  # what the assignment named is not sent again
    await follower.leave()


async def test_an_event_sent_by_another_site_process_reaches_the_socket(eager, redis_url, monkeypatch):
    # The publishing process and the socket's process share only Redis: another layer instance sends the event,
    # and the socket's process, which never saw the publication, reads it from Redis and the database.
    workers, keys = await relay_workers(1)
    job = await chain_job()
    (comm,) = await assigned(keys, job)
    events = []
    monkeypatch.setattr(fanout, "_push_event", lambda group, event: events.append((group, event)))
    await publish(job, 1)
    ((group, event),) = events
    fanout.PUBLICATIONS.clear()
    other = channel_layer.ResilientRedisChannelLayer(hosts=[redis_url], prefix="echo2test")
    await other.group_send(group, event)
    got = m.SnapshotAvailable.model_validate(await comm.receive_json_from(timeout=5))
    assert (got.version, got.parent) == (1, LEARNER_RELAY)
    credentials.verify(job.transfer_secret, got.credential, job_id=job.pk, version=1, now=time.time(),
                       worker_id=workers[0].pk)
    await comm.disconnect()


async def test_many_sockets_of_one_process_share_one_read():
    calls = []

    def loader(job_id, version):
        calls.append((job_id, version))
        time.sleep(0.05)
        return None

    cache = fanout.PublicationCache(loader=loader)
    assert await asyncio.gather(*(cache.get(1, 2, "n") for _ in range(50))) == [None] * 50
    assert calls == [(1, 2)]


MESSAGE_BOUND = 1024  # bytes: a worker's whole message, route and credentials included


def test_a_workers_message_names_the_manifest_by_reference_and_its_size_does_not_grow_with_the_chunks():
    from dataplane.broadcast.chains import ChainPlan

    plan = ChainPlan(chains=((7, 8, 9),), rollout_only=(10,))
    routes = ((7, (None, 8)), (8, (7, 9)), (9, (8, None)), (10, None))
    sizes = {}
    for chunks in (1, 256, 4096):
        manifest = build_manifest(bytes(chunks * 1024), job_id=3, version=4, chunk_bytes=1024)
        shared = fanout.Announced(job_id=3, version=4, url="http://l/v4/", manifest=manifest_reference(manifest),
                                  published_at=12.5, strategy="chain", learner_relay=LEARNER_RELAY,
                                  secret=credentials.new_secret(), expires=2_000_000_000)
        publication = fanout.Publication.build(shared, nonce="x", plan=plan, addresses={7: "a:1", 8: "b:2"})
        for worker_id, route in routes:
            text = publication.text_for(worker_id)
            expected = fanout.notice(shared, worker_id=worker_id, route=route, addresses={7: "a:1", 8: "b:2"})
            assert json.loads(text) == expected.model_dump(mode="json")
            sent = m.SnapshotAvailable.model_validate_json(text)
            assert (sent.manifest_sha256, sent.manifest_bytes) == manifest_reference(manifest)
            sizes[chunks, worker_id] = len(text.encode()), len(str(sent.manifest_bytes))
        assert publication.text_for(11) is None  # not in the plan: nothing
    # 256 chunks put 26.7 KB of manifest in every message before; now a message is as long whatever the chunks, but
    # for the digits of the manifest's size.
    assert max(size for size, _ in sizes.values()) < MESSAGE_BOUND, sizes
    for worker_id, _ in routes:
        assert len({size - digits for (_, w), (size, digits) in sizes.items() if w == worker_id}) == 1, sizes


async def test_a_socket_joins_its_group_again_before_channels_redis_forgets_it(monkeypatch, redis_client):
    layer = get_channel_layer()
    follower = fanout.JobFollower(layer, await layer.new_channel(), 1)
    await follower.follow({"type": "assign", "job_id": 5, "base": None, "snapshot": None})
    redis_client.delete(layer._group_key(fanout.agents_group(5)))  # the membership expired (group_expiry)
    monkeypatch.setattr(fanout, "REJOIN_AFTER_S", 0.0)
    await follower.stay()
    await layer.group_send(fanout.agents_group(5), {"type": "probe"})
    assert (await asyncio.wait_for(layer.receive(follower.channel_name), 5))["type"] == "probe"
    await follower.leave()
