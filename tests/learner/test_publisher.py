"""The learner publishes a model as a snapshot a chain seed can pull from its relay, and keeps what agents may ask
for: its base (version 0), the newest few, and everything recent."""

from __future__ import annotations

import asyncio
import os
import time

import torch
from safetensors.torch import load

from dataplane import basemodel
from dataplane.broadcast.relay import SnapshotRelay
from dataplane.broadcast.store import list_versions, version_dir
from dataplane.snapshot import fetch_payload, parse_manifest
from learner.publisher import LearnerRelay, SnapshotServer, SnapshotStore, manifest_json


def test_a_published_version_reaches_a_seed_through_the_learner_relay(tmp_path):
    model = torch.nn.Linear(64, 32)
    store = SnapshotStore(tmp_path, job_id=5, chunk_bytes=1024, keep=2)
    relay = LearnerRelay(store, uplink_bps=None)
    try:
        for version in (1, 2, 3):
            manifest = store.write(model, version)
            relay.serve(version)  # and stops serving what the store pruned
        assert list_versions(tmp_path) == [2, 3] and set(relay.hub.relays) == {(5, 2), (5, 3)}
        host, _, port = relay.address.rpartition(":")

        async def seed() -> bytes:
            child = SnapshotRelay(parse_manifest(manifest_json(manifest)), worker_id=9)
            child.set_parent(host, int(port))
            return await asyncio.wait_for(child.receive(), 30)

        tensors = load(asyncio.run(seed()))
    finally:
        relay.stop()
    assert torch.equal(tensors["weight"], model.weight.detach()) and torch.equal(tensors["bias"], model.bias.detach())


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
    try:  # the base travels over the learner's HTTP server like any version, every chunk verified
        payload = fetch_payload(server.url_for(0), parse_manifest(manifest_json(base)))
    finally:
        server.stop()
    assert payload == basemodel.pack(tiny_model_dir)
