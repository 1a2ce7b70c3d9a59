"""Bounded relays, on real sockets: a parent declaring a 100 MiB frame for a 100-byte chunk, or a stranger
opening with a 100 MiB frame instead of a hello, is cut off before a byte of the payload is read, memory staying
flat (tracemalloc's peak) and the liar getting out only what the sockets buffer; a hub refuses a hello for a
version it does not serve without naming any job or version it does."""

from __future__ import annotations

import asyncio
import json
import os
import struct
import tracemalloc

from dataplane.broadcast import framing
from dataplane.broadcast.hub import RelayHub
from dataplane.broadcast.relay import RelayTimeouts, SnapshotRelay
from dataplane.credentials import issue, new_secret
from dataplane.snapshot import build_manifest, split

JOB, VERSION = 4, 2
SECRET = new_secret()
PAYLOAD = os.urandom(300)
MANIFEST = build_manifest(PAYLOAD, job_id=JOB, version=VERSION, chunk_bytes=100)  # three chunks of 100 bytes
LIE = 100 << 20
PIECE = bytes(1 << 20)


async def stream_lie(writer: asyncio.StreamWriter, header: dict) -> int:
    """Write a frame whose header declares ``LIE`` payload bytes, then as many of them as the peer takes."""
    raw = json.dumps(header).encode()
    writer.write(struct.pack(">4sIQ", framing.MAGIC, len(raw), LIE) + raw)
    sent = 0
    try:
        while sent < LIE:
            writer.write(PIECE)
            await asyncio.wait_for(writer.drain(), 2)
            sent += len(PIECE)
    except (ConnectionError, TimeoutError):
        pass
    writer.close()
    return sent


def lying_chunk() -> dict:
    return {"type": "chunk", "job_id": JOB, "version": VERSION, "index": 0, "size": LIE, "sha256": "0" * 64}


async def child_of_a_lying_parent() -> tuple[list[dict], list[int]]:
    sent: list[int] = []

    async def parent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await framing.read_frame(reader, peer="child", timeout=5)  # the hello
        await framing.write_frame(writer, framing.accept(job_id=JOB, version=VERSION, chunks=3), peer="child",
                                  timeout=5)
        sent.append(await stream_lie(writer, lying_chunk()))

    server = await asyncio.start_server(parent, "127.0.0.1", 0)
    events: list[dict] = []
    child = SnapshotRelay(MANIFEST, worker_id=7, on_event=events.append, credential="e2t1.x",
                          timeouts=RelayTimeouts(parent_retries=1, give_up=30, stall=2))
    child.set_parent("127.0.0.1", server.sockets[0].getsockname()[1])
    receive = asyncio.create_task(child.receive())
    while not any(e["event"] == "parent_failed" for e in events):
        await asyncio.sleep(0.05)
    receive.cancel()
    server.close()
    await asyncio.sleep(0.2)  # the parent's writer sees the close
    return events, sent


def test_a_parent_declaring_more_than_the_chunks_size_is_cut_off_unread() -> None:
    tracemalloc.start()
    try:
        events, sent = asyncio.run(child_of_a_lying_parent())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    failed = next(e for e in events if e["event"] == "parent_failed")
    assert f"declared a {LIE}-byte payload for a chunk frame, which takes at most 100" in failed["reason"]
    assert not any(e["event"] == "chunk" for e in events)
    assert peak < 8 << 20, f"the child held {peak} bytes for a 100-byte chunk"
    assert sent and max(sent) < 32 << 20, sent  # what loopback's buffers took, not the 100 MiB


async def stranger_opening_with_a_chunk() -> tuple[int, RelayHub]:
    hub = RelayHub(assign_wait=0.2)
    hub.register(SnapshotRelay(MANIFEST, chunks=dict(enumerate(split(PAYLOAD, 100))), worker_id=0, secret=SECRET))
    port = await hub.start()
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    sent = await stream_lie(writer, lying_chunk())
    await hub.close()
    return sent, hub


def test_a_hub_reads_no_payload_before_a_hello() -> None:
    tracemalloc.start()
    try:
        sent, hub = asyncio.run(stranger_opening_with_a_chunk())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"the hub held {peak} bytes for a stranger's first frame"
    assert sent < 32 << 20, sent


async def ask(port: int, *, job_id: int, version: int, credential: str | None) -> str:
    reader, writer = await framing.open_peer("127.0.0.1", port, timeout=5)
    await framing.write_frame(writer, framing.hello(job_id=job_id, version=version, worker_id=9, have=[],
                                                    credential=credential), peer="hub", timeout=5)
    frame = await framing.read_frame(reader, peer="hub", timeout=5)
    writer.close()
    assert frame.type == "refuse"
    return frame.header["reason"]


def test_a_hub_names_nothing_it_serves_to_a_hello() -> None:
    served = [(JOB, VERSION), (JOB, VERSION + 1), (JOB + 5, 11)]

    async def run() -> list[str]:
        hub = RelayHub(assign_wait=0.1)
        for job_id, version in served:
            manifest = build_manifest(PAYLOAD, job_id=job_id, version=version, chunk_bytes=100)
            hub.register(SnapshotRelay(manifest, chunks=dict(enumerate(split(PAYLOAD, 100))), worker_id=0,
                                       secret=SECRET))
        port = await hub.start()
        try:
            valid_elsewhere = issue(SECRET, job_id=JOB, worker_id=9, lowest=7, highest=7, expires=2**31)
            return [await ask(port, job_id=JOB, version=7, credential=None),
                    await ask(port, job_id=JOB, version=7, credential=valid_elsewhere),
                    await ask(port, job_id=99, version=1, credential="e2t1.garbage")]
        finally:
            await hub.close()

    reasons = asyncio.run(run())
    assert reasons[:2] == [f"not assigned job {JOB} version 7 (or not yet)"] * 2
    assert reasons[2] == "not assigned job 99 version 1 (or not yet)"
    for reason in reasons:
        for job_id, version in served:
            assert f"job {job_id} version {version}" not in reason and f"version {version} " not in reason + " "
