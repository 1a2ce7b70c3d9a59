"""The learner publishes a model as a snapshot a chain seed can pull from its relay, and keeps what agents may ask
for: its base (version 0), the newest few, and everything recent; its HTTP server and relay hub hand weights only
to holders of a valid transfer credential, never a listing."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time

import httpx
import pytest
import torch
from safetensors.torch import load

from dataplane import basemodel
from dataplane.broadcast import framing
from dataplane.broadcast.relay import SnapshotRelay
from dataplane.broadcast.store import list_versions, version_dir
from dataplane.credentials import issue, new_secret
from dataplane.snapshot import SnapshotError, fetch_payload, full_url, parse_manifest
from learner.serving import RELAY_MODES, LearnerRelay, SnapshotServer, manifest_json
from learner.snapshots import SnapshotStore

JOB = 5
SECRET = new_secret()


def cred(version: int, *, worker_id: int = 9, job_id: int = JOB, ttl: int = 600, secret: str = SECRET) -> str:
    return issue(secret, job_id=job_id, worker_id=worker_id, lowest=version, highest=version,
                 expires=int(time.time()) + ttl)


@pytest.mark.parametrize("mode", RELAY_MODES)
def test_a_published_version_reaches_a_seed_through_the_learner_relay(tmp_path, mode):
    model = torch.nn.Linear(64, 32)
    store = SnapshotStore(tmp_path, job_id=JOB, chunk_bytes=1024, keep=2, dtype="fp32", full_every=1)
    relay = LearnerRelay(store, uplink_bps=None, mode=mode)
    try:
        relay.set_secret(SECRET)  # what the site's reply to the announcement carries
        for version in (1, 2, 3):
            manifest = store.write(model, version)
            relay.serve(version)  # and stops serving what the store pruned
        assert list_versions(tmp_path) == [2, 3] and set(relay.served()) == {2, 3}
        host, _, port = relay.address.rpartition(":")

        async def seed(credential: str | None) -> bytes:
            child = SnapshotRelay(parse_manifest(manifest_json(manifest)), worker_id=9, credential=credential)
            child.set_parent(host, int(port))
            return await asyncio.wait_for(child.receive(), 30)

        async def knock(credential: str | None) -> framing.Frame:
            reader, writer = await framing.open_peer(host, int(port), timeout=5)
            await framing.write_frame(writer, framing.hello(job_id=JOB, version=3, worker_id=9, have=[],
                                                            credential=credential), peer="hub", timeout=5)
            frame = await framing.read_frame(reader, peer="hub", timeout=10)
            writer.close()
            return frame

        tensors = load(asyncio.run(seed(cred(3))))
        refused = asyncio.run(knock(None))
        assert refused.type == "refuse" and refused.header["reason"] == "worker 9: no credential"
        assert asyncio.run(knock(cred(3, ttl=-1))).header["reason"].startswith("worker 9: credential expired")
        assert relay.served()[3].refused == 2 and relay.served()[3].children_served == 1
    finally:
        relay.stop()
    assert torch.equal(tensors["weight"], model.weight.detach()) and torch.equal(tensors["bias"], model.bias.detach())


@pytest.fixture
def served(tmp_path):
    store = SnapshotStore(tmp_path, job_id=JOB, chunk_bytes=1024, keep=4)
    manifest = store.write(torch.nn.Linear(64, 32), 1)
    server = SnapshotServer(store).start()
    yield server, manifest
    server.stop()


def test_the_snapshot_server_refuses_without_a_credential_and_never_lists(served, caplog):
    caplog.set_level(logging.WARNING, logger="learner.serving")
    server, _ = served
    server.set_secret(SECRET)
    base = f"http://127.0.0.1:{server.port}"
    for path in ("/", "/v1/", "/v1/chunks/", "/v1/manifest.json", "/v1/chunks/0", "/../", "/job5/"):
        reply = httpx.get(base + path)
        assert reply.status_code == 401, path
        assert reply.headers["WWW-Authenticate"].startswith("Bearer")
        assert reply.text == "a transfer credential is required (Authorization: Bearer <credential>)\n"
    for path in ("/", "/v1/", "/v1/chunks/", "/v1/chunks/%2e%2e/manifest.json", "/v1/chunks/0/"):  # never a listing
        reply = httpx.get(base + path, headers={"Authorization": f"Bearer {cred(1)}"})
        assert reply.status_code == 404 and reply.text == "not found\n", path
    assert server.refused[401] == 7
    refusals = [r.getMessage() for r in caplog.records if r.name == "learner.serving"]
    assert len(refusals) == 7 and all("from 127.0.0.1:" in line for line in refusals)


@pytest.mark.parametrize(("credential", "reason"), [
    ("nonsense", "malformed credential"),
    (cred(1, secret="another secret"), "bad credential signature"),
    (cred(1, ttl=-10), "credential expired"),
    (cred(1, job_id=JOB + 1), f"credential for job {JOB + 1}, not job {JOB}"),
    (cred(2), "credential covers versions 2..2, not 1"),
])
def test_a_wrong_credential_is_forbidden_with_its_reason(served, credential, reason):
    server, _ = served
    server.set_secret(SECRET)
    for path in ("/v1/manifest.json", "/v1/chunks/0"):
        reply = httpx.get(f"http://127.0.0.1:{server.port}{path}", headers={"Authorization": f"Bearer {credential}"})
        assert reply.status_code == 403 and reply.text.startswith(reason), reply.text
    assert server.refused[403] == 2


def test_a_valid_credential_fetches_the_whole_verified_snapshot(served):
    server, manifest = served
    url = server.url_for(1)
    with pytest.raises(SnapshotError, match="403 this server does not hold the job's transfer secret yet"):
        fetch_payload(url, manifest, credential=cred(1))  # before the announcement's reply
    server.set_secret(SECRET)
    payload = fetch_payload(url, manifest, credential=cred(1))
    assert load(payload)["weight"].shape == (32, 64)
    reply = httpx.get(url + "manifest.json", headers={"Authorization": f"Bearer {cred(1)}"})
    assert reply.status_code == 200 and parse_manifest(json.loads(reply.content)) == manifest
    missing = httpx.get(server.url_for(7) + "chunks/0", headers={"Authorization": f"Bearer {cred(7)}"})
    assert missing.status_code == 404 and "pruned?" in missing.text
    started = time.monotonic()
    with pytest.raises(SnapshotError, match=r"chunk 0 of version 1 from .*: 401 a transfer credential is required"):
        fetch_payload(url, manifest, retries=50)  # a refusal is final: not retried 50 times
    assert time.monotonic() - started < 5


def test_the_base_stays_and_so_does_every_recent_version(tmp_path, tiny_model_dir):
    model = torch.nn.Linear(8, 4)
    store = SnapshotStore(tmp_path, job_id=5, chunk_bytes=4096, keep=2, retain_s=60.0)
    base = store.write_base(tiny_model_dir)
    assert base.format == basemodel.FORMAT and base.sha256 == basemodel.digest(tiny_model_dir)
    for version in range(1, 6):
        store.write(model, version)
    assert list_versions(tmp_path) == [0, 1, 2, 3, 4, 5]  # all published within the last minute
    for version in (1, 2, 3):  # as if published ten minutes ago
        os.utime(version_dir(tmp_path, version), (time.time() - 600, time.time() - 600))
    store.write(model, 6)
    assert list_versions(tmp_path) == [0, 4, 5, 6] and store.base_manifest() == base

    server = SnapshotServer(store).start()
    server.set_secret(SECRET)
    try:  # the base travels over the learner's HTTP server like any version, every chunk verified
        payload = fetch_payload(server.url_for(0), parse_manifest(manifest_json(base)), credential=cred(0))
    finally:
        server.stop()
    assert payload == basemodel.pack(tiny_model_dir)


@pytest.mark.parametrize("mode", RELAY_MODES)
def test_a_delta_version_goes_down_the_relay_as_is_and_its_full_payload_is_served_over_http(tmp_path, mode):
    model = torch.nn.Linear(64, 32)
    store = SnapshotStore(tmp_path, job_id=JOB, chunk_bytes=1024)
    store.write(model, 1)
    with torch.no_grad():
        model.bias.add_(1.0)
    delta = store.write(model, 2)
    assert delta.kind == "delta" and delta.total_bytes < delta.full.total_bytes / 10
    relay, server = LearnerRelay(store, uplink_bps=None, mode=mode), SnapshotServer(store).start()
    try:
        relay.set_secret(SECRET)
        server.set_secret(SECRET)
        relay.serve(2)
        host, _, port = relay.address.rpartition(":")

        async def seed() -> bytes:
            child = SnapshotRelay(parse_manifest(manifest_json(delta)), worker_id=9, credential=cred(2))
            child.set_parent(host, int(port))
            return await asyncio.wait_for(child.receive(), 30)

        assert len(asyncio.run(seed())) == delta.total_bytes  # the delta itself, verified against its manifest
        full = fetch_payload(full_url(server.url_for(2)), delta.full, credential=cred(2))  # the same credential
        reply = httpx.get(full_url(server.url_for(2)) + "manifest.json", headers={"Authorization": f"Bearer {cred(2)}"})
        assert reply.status_code == 200 and parse_manifest(json.loads(reply.content)) == delta.full
        refused = httpx.get(full_url(server.url_for(2)) + "chunks/0", headers={"Authorization": f"Bearer {cred(1)}"})
        assert refused.status_code == 403
    finally:
        relay.stop()
        server.stop()
    tensors = load(full)
    assert tensors["bias"].dtype == torch.bfloat16 and torch.equal(tensors["bias"], model.bias.detach().bfloat16())
