"""Relays.busy(): what the WAN bench's pause experiment (worker_agent/rollout_loop.py PAUSE_WHILE_RELAYING) waits on:
a relay still receiving, or serving a child, keeps the agent's relays busy; an origin with no child does not."""

from __future__ import annotations

import asyncio
import os

from dataplane.broadcast.relay import SnapshotRelay
from dataplane.snapshot import build_manifest, split
from worker_agent.relaying import Relays


async def nothing(_message) -> None:
    return None


def test_a_relay_receiving_keeps_the_relays_busy_and_a_complete_one_without_children_does_not():
    async def main() -> None:
        payload = os.urandom(300_000)
        manifest = build_manifest(payload, job_id=1, version=2, chunk_bytes=100_000)
        relays = Relays(worker_id=3, bandwidth_bps=None, listen=None, report=nothing)
        assert not relays.busy()
        origin = SnapshotRelay(manifest, worker_id=3, chunks=dict(enumerate(split(payload, 100_000))))
        relays.relays[(1, 2)] = origin
        assert origin.complete and not origin.serving and not relays.busy()
        relays.relays[(1, 3)] = SnapshotRelay(manifest.model_copy(update={"version": 3}), worker_id=3)
        assert relays.busy()
        relays.drop((1, 3))
        assert not relays.busy()

    asyncio.run(main())
