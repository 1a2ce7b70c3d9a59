"""A publication's message names the manifest by reference, end to end: the site announces a learner's versions (a
real snapshot store and server), the worker's socket (the real ASGI app over a real Redis channel layer) gets a
message of a few hundred bytes, and an agent session fed the frames as they came fetches each version's manifest
once from the learner, checks it against the reference and installs the version."""

from __future__ import annotations

import json

import pytest
import torch
from channels.db import database_sync_to_async
from transformers import AutoModelForCausalLM

from dataplane import messages as m
from dataplane.snapshot import manifest_reference
from learner.serving import SnapshotServer, manifest_json
from learner.snapshots import SnapshotStore
from marketplace import services
from marketplace.models import Job
from tests.worker_agent.test_session import make_session, until

from . import factories
from .test_agent_socket import connect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("redis_url")]

MESSAGE_BOUND = 1024  # bytes of one worker's snapshot frame; the manifest of v1 alone is several KB


@pytest.fixture
def eager(settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    return settings


@database_sync_to_async
def a_job_and_its_worker():
    job = factories.job(factories.user())
    worker, key = factories.worker(factories.user())  # no relay address: it fetches over HTTP
    return job, worker, key


@database_sync_to_async
def start(job) -> None:
    services.job_start(job=Job.objects.get(pk=job.pk))


@database_sync_to_async
def publish(job, version: int, manifest, url: str) -> None:
    services.snapshot_publish(job=Job.objects.get(pk=job.pk), version=version, url=url,
                              manifest=manifest_json(manifest))


async def test_an_agent_installs_what_the_site_announced_by_reference(eager, tmp_path, tiny_model_dir):
    job, worker, key = await a_job_and_its_worker()
    store = SnapshotStore(tmp_path / "snapshots", job_id=job.pk, chunk_bytes=1024)  # v1: 23 chunks
    server = SnapshotServer(store, secret=job.transfer_secret).start()
    comm = await connect(key)
    session, agent_socket = make_session(tmp_path, [])
    try:
        await comm.send_json_to({"type": "hello", "agent_version": "test"})
        assert (await comm.receive_json_from(timeout=10))["type"] == "welcome"
        await start(job)
        assigned = await comm.receive_from(timeout=10)
        assert json.loads(assigned)["type"] == "assign"
        await session._dispatch(assigned)

        base = store.write_base(tiny_model_dir)
        await publish(job, 0, base, server.url_for(0))
        frame = await comm.receive_from(timeout=10)
        sent = m.SnapshotAvailable.model_validate_json(frame)
        assert (sent.version, sent.url) == (0, server.url_for(0))
        assert (sent.manifest_sha256, sent.manifest_bytes) == manifest_reference(base)
        await session._dispatch(frame)
        await until(lambda: session.installs.installed_version(job.pk) == 0, "the base installed", timeout=60)

        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        with torch.no_grad():
            model.model.norm.weight.add_(1.0)
        v1 = store.write(model, 1)
        await publish(job, 1, v1, server.url_for(1))
        frame = await comm.receive_from(timeout=10)
        assert len(frame.encode()) < MESSAGE_BOUND < len(v1.model_dump_json()), len(frame)
        await session._dispatch(frame)
        await until(lambda: session.installs.installed_version(job.pk) == 1, "v1 installed", timeout=60)

        assert session.installs.manifests.fetched == 2  # each version's manifest, once, from the learner
        assert [(r["version"], r["source"]) for r in agent_socket.of("snapshot_installed")] == [(0, "http"),
                                                                                              (1, "http")]
        assert session.installs.job.engine.model.model.norm.weight.detach().equal(model.model.norm.weight.detach())
    finally:
        session._stop_rollout()
        await comm.disconnect()
        server.stop()
