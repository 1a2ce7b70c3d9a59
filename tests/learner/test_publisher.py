"""The learner publishes a model as a snapshot a chain seed can pull from its relay, and keeps the newest few."""

from __future__ import annotations

import asyncio

import torch
from safetensors.torch import load

from dataplane.broadcast.relay import SnapshotRelay
from dataplane.broadcast.store import list_versions
from dataplane.snapshot import parse_manifest
from learner.publisher import LearnerRelay, SnapshotStore, manifest_json


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
