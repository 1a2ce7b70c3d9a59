"""A child switched to a new parent in the middle of a chunk (a chain repair) resumes it after the bytes it already
holds, rather than taking the chunk again whole (docs/broadcast.md "Pipelining on long links"); if those bytes were
bad, the whole chunk is taken again from the new parent, which is not blamed for them. Real sockets."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from dataplane.broadcast import framing
from dataplane.broadcast.framing import FrameError
from dataplane.broadcast.hub import RelayHub
from dataplane.broadcast.ratelimit import PIECE_BYTES, bucket
from dataplane.broadcast.relay import RelayTimeouts, SnapshotRelay
from dataplane.credentials import issue, new_secret
from dataplane.snapshot import build_manifest, split
from tests.dataplane.broadcast.corrupting_relay import CorruptingRelay

JOB, VERSION, CHILD = 6, 2, 9
SECRET = new_secret()
CHUNK, PART = 400_000, 20_000
PAYLOAD = os.urandom(3 * CHUNK)
MANIFEST = build_manifest(PAYLOAD, job_id=JOB, version=VERSION, chunk_bytes=CHUNK)
CHUNKS = dict(enumerate(split(PAYLOAD, CHUNK)))


class RecordingRelay(SnapshotRelay):
    """An origin that records (chunk, offset, size) of every part it sends."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[tuple[int, int, int]] = []

    async def _send_chunk(self, writer, index: int, offset: int, data: bytes, *, peer: str) -> None:
        self.sent.append((index, offset, len(data)))
        await super()._send_chunk(writer, index, offset, data, peer=peer)


def cred() -> str:
    return issue(SECRET, job_id=JOB, worker_id=CHILD, lowest=VERSION, highest=VERSION, expires=int(time.time()) + 600)


async def switch_mid_chunk(first: SnapshotRelay, second: SnapshotRelay) -> tuple[SnapshotRelay, int]:
    """The child pulls from ``first`` (slow) until it holds more than two parts of chunk 0 but not all of it, then
    the site routes it to ``second``. Returns the child once complete and the bytes of chunk 0 it held at the switch."""
    hubs = [RelayHub(assign_wait=1.0), RelayHub(assign_wait=1.0)]
    ports = []
    for hub, relay in zip(hubs, (first, second), strict=True):
        hub.register(relay)
        ports.append(await hub.start())
    child = SnapshotRelay(MANIFEST, worker_id=CHILD, credential=cred(), timeouts=RelayTimeouts(give_up=30))
    child.set_parent("127.0.0.1", ports[0])
    receiving = asyncio.create_task(child.receive())
    deadline = time.monotonic() + 20
    while child._book.partial().get(0, 0) <= 2 * PART:
        assert time.monotonic() < deadline, "the child never held part of chunk 0"
        await asyncio.sleep(0.005)
    held = child._book.partial()[0]
    child.set_parent("127.0.0.1", ports[1])
    assert await asyncio.wait_for(receiving, 30) == PAYLOAD
    for hub in hubs:
        await hub.close()
    return child, held


def test_a_child_switched_mid_chunk_takes_only_the_rest_of_it_from_its_new_parent() -> None:
    slow = SnapshotRelay(MANIFEST, chunks=CHUNKS, worker_id=0, secret=SECRET, part_bytes=PART,
                         uplink=bucket(200_000, burst=PIECE_BYTES))
    fresh = RecordingRelay(MANIFEST, chunks=CHUNKS, worker_id=1, secret=SECRET, part_bytes=PART)
    child, held = asyncio.run(switch_mid_chunk(slow, fresh))
    of_chunk0 = [(offset, size) for index, offset, size in fresh.sent if index == 0]
    assert of_chunk0 and of_chunk0[0][0] >= held > 2 * PART  # resumed where the child was (or past it: more came)
    assert sum(size for _, size in of_chunk0) == CHUNK - of_chunk0[0][0]  # and only the rest was sent
    assert child.stats.resumed_bytes >= held and child.stats.bad_chunks == 0
    assert child.stats.from_parent == 3


def test_bad_first_bytes_from_the_old_parent_make_the_new_one_send_the_chunk_whole_unblamed() -> None:
    liar = CorruptingRelay(MANIFEST, chunks=CHUNKS, worker_id=0, secret=SECRET, part_bytes=PART, corrupt={0: 1},
                           uplink=bucket(200_000, burst=PIECE_BYTES))
    fresh = RecordingRelay(MANIFEST, chunks=CHUNKS, worker_id=1, secret=SECRET, part_bytes=PART)
    child, held = asyncio.run(switch_mid_chunk(liar, fresh))
    starts = [offset for index, offset, _ in fresh.sent if index == 0]
    assert starts[0] >= held and 0 in starts[1:]  # resumed, found bad at the end, then sent whole
    assert child.stats.bad_chunks == 0 and child.stats.from_parent == 3 and child.stats.from_fallback == 0


def test_a_hello_with_a_malformed_partial_is_refused_as_a_frame() -> None:
    header = framing.hello(job_id=JOB, version=VERSION, worker_id=CHILD, have=[], partial={0: 5})
    assert header["partial"] == [[0, 5]]
    for bad in ([[0]], [[0, -1]], [["0", 5]], [[0, True]], "0:5"):
        try:
            framing.encode_head(header | {"partial": bad}, 0)
        except FrameError as err:
            assert "partial" in str(err)
        else:
            raise AssertionError(f"partial {bad!r} was accepted")
