"""Cut-through forwarding on real sockets (docs/broadcast.md "Pipelining on long links"): a relay passes each part
of a chunk to its child before the chunk is whole, yet installs and counts only verified chunks; a bad chunk's parts
that went ahead are sent again, so the child never installs or even completes a bad copy; a part leaving a gap is
refused; and a child that reads nothing holds its parent to a bounded write buffer."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from dataplane.broadcast import framing
from dataplane.broadcast.assembly import ChunkBook
from dataplane.broadcast.framing import TransferError
from dataplane.broadcast.hub import RelayHub
from dataplane.broadcast.ratelimit import PIECE_BYTES, bucket
from dataplane.broadcast.relay import RelayTimeouts, SnapshotRelay
from dataplane.credentials import fingerprint, issue, new_secret
from dataplane.snapshot import SnapshotError, build_manifest, ordered_chunks, split
from tests.dataplane.broadcast.corrupting_relay import CorruptingRelay

JOB, VERSION, RELAY, CHILD = 5, 3, 1, 2
SECRET = new_secret()
CHUNK, PART = 200_000, 20_000
PAYLOAD = os.urandom(4 * CHUNK)
MANIFEST = build_manifest(PAYLOAD, job_id=JOB, version=VERSION, chunk_bytes=CHUNK)
CHUNKS = dict(enumerate(split(PAYLOAD, CHUNK)))


def cred(worker_id: int) -> str:
    return issue(SECRET, job_id=JOB, worker_id=worker_id, lowest=VERSION, highest=VERSION,
                 expires=int(time.time()) + 600)


async def start(relay: SnapshotRelay) -> tuple[RelayHub, int]:
    hub = RelayHub(assign_wait=1.0)
    hub.register(relay)
    return hub, await hub.start()


async def chain(origin: SnapshotRelay, *, watch=None) -> tuple[SnapshotRelay, SnapshotRelay, list]:
    """origin -> relay (worker RELAY, parts of PART bytes) -> child (worker CHILD); ``watch(relay, child)`` is
    polled every 5 ms while they receive. Returns both and what ``watch`` returned."""
    relay = SnapshotRelay(MANIFEST, worker_id=RELAY, credential=cred(RELAY), part_bytes=PART,
                          timeouts=RelayTimeouts(give_up=30))
    token = cred(CHILD)  # one token: the parent's word for it and what the child shows must agree to the byte
    relay.assign_children({CHILD: fingerprint(token)})
    child = SnapshotRelay(MANIFEST, worker_id=CHILD, credential=token, timeouts=RelayTimeouts(give_up=30))
    hubs = [await start(origin), await start(relay)]
    relay.set_parent("127.0.0.1", hubs[0][1])
    child.set_parent("127.0.0.1", hubs[1][1])
    seen = []
    receiving = asyncio.gather(relay.receive(), child.receive())
    while not receiving.done():
        if watch is not None:
            seen.append(watch(relay, child))
        await asyncio.sleep(0.005)
    payloads = await asyncio.wait_for(receiving, 30)
    for hub, _ in hubs:
        await hub.close()
    assert payloads == [PAYLOAD, PAYLOAD]
    return relay, child, seen


def test_a_relay_forwards_parts_of_a_chunk_it_has_not_verified_yet_and_installs_only_verified_ones() -> None:
    # The origin's uplink (400 kB/s) makes each 200 kB chunk take half a second to reach the relay.
    origin = SnapshotRelay(MANIFEST, chunks=CHUNKS, worker_id=0, secret=SECRET, part_bytes=PART,
                           uplink=bucket(400_000, burst=PIECE_BYTES))

    def watch(relay: SnapshotRelay, child: SnapshotRelay) -> tuple[int, int, list[int], list[int]]:
        return child._book.available(0)[0], relay._book.available(0)[0], relay.have, child.have

    relay, child, seen = asyncio.run(chain(origin, watch=watch))
    ahead = [(c, r) for c, r, relay_has, _ in seen if c > 0 and 0 not in relay_has]
    assert ahead, "the child never held a part of chunk 0 before the relay had verified it"
    assert all(c <= r for c, r in ahead)  # never more than the relay holds
    # Installed and counted: only verified chunks, on both sides; every chunk once.
    assert all(set(child_has) <= set(relay_has) for _, _, relay_has, child_has in seen)
    assert (relay.stats.from_parent, child.stats.from_parent) == (4, 4)
    assert relay.stats.bad_chunks == child.stats.bad_chunks == 0


def test_a_bad_chunk_forwarded_in_parts_is_sent_again_and_the_child_never_completes_the_bad_copy() -> None:
    # The origin flips the first byte of chunk 1 the first time it sends it; the relay forwards the bad copy's
    # parts as they come, finds the sha256 wrong on the last one, asks again and sends the good copy from offset 0.
    origin = CorruptingRelay(MANIFEST, chunks=CHUNKS, worker_id=0, secret=SECRET, part_bytes=PART,
                             corrupt={1: 1}, uplink=bucket(2_000_000, burst=PIECE_BYTES))

    def watch(relay: SnapshotRelay, child: SnapshotRelay) -> bool:  # the child holds parts of the bad copy
        return relay._book.generation[1] == 0 and 1 not in child.have and child._book.available(1)[0] > 0

    relay, child, seen = asyncio.run(chain(origin, watch=watch))
    assert relay.stats.bad_chunks == 1 and relay.stats.from_parent == 4
    assert any(seen), "the child never held a part of the bad copy (no cut-through)"
    assert child.stats.bad_chunks == 0 and child.stats.from_parent == 4 and child.stats.from_fallback == 0


def test_the_book_refuses_a_gap_and_a_part_past_the_chunk_and_restarts_children_after_a_bad_copy() -> None:
    book = ChunkBook(MANIFEST)
    assert book.add_part(0, 0, CHUNKS[0][:PART], peer="p") is None
    assert book.available(0)[0] == PART and not book.ready(0, PART) and book.ready(0, 0)
    with pytest.raises(TransferError, match=rf"bytes {2 * PART}\.\.{3 * PART} of chunk 0 \({CHUNK} bytes\), "
                                            rf"holding only its first {PART}"):
        book.add_part(0, 2 * PART, CHUNKS[0][:PART], peer="p")
    with pytest.raises(TransferError, match="of chunk 0"):
        book.add_part(0, CHUNK - 10, bytes(20), peer="p")
    assert book.add_part(0, 0, CHUNKS[0][:PART], peer="p") is None  # a new parent starts again at 0: fine
    with pytest.raises(SnapshotError, match="chunk 0 of version 3: sha256 mismatch"):  # hashed as it came
        book.add_part(0, PART, b"x" + CHUNKS[0][PART + 1 :], peer="p")
    assert book.generation[0] == 1 and book.available(0)[0] == 0 and 0 not in book.done  # discarded
    assert book.add_part(1, 0, CHUNKS[1], peer="p") == CHUNKS[1]  # one part, the whole chunk: verified
    book.add_part(2, 0, CHUNKS[2][:PART], peer="p")
    book.add_part(2, 0, b"z" * PART, peer="p")  # overwritten: the chunk is hashed whole at the end
    with pytest.raises(SnapshotError):
        book.add_part(2, PART, CHUNKS[2][PART:], peer="p")
    book.add_part(2, 0, b"z" * PART, peer="p")
    book.add_part(2, 0, CHUNKS[2][:PART], peer="p")  # a new parent's good bytes over the bad ones
    assert book.available(2)[0] == PART and book.add_part(2, PART, CHUNKS[2][PART:], peer="p") == CHUNKS[2]
    book.add_part(0, 0, b"y" * PART, peer="p")
    book.verified(0, CHUNKS[0])  # the good copy came from elsewhere: what went ahead differs, send it again
    assert book.generation[0] == 2 and book.available(0) == (CHUNK, CHUNKS[0])


def _feed(book: ChunkBook, index: int, data: bytes, *, offset: int = 0) -> None:
    """Chunk ``index`` (from ``offset``) in parts, stored once verified as the relay does."""
    for start in range(offset, len(data), PART):
        whole = book.add_part(index, start, data[start:start + PART], peer="p")
        if whole is not None:
            book.verified(index, whole)


def test_the_book_hashes_the_whole_payload_as_it_arrives_whatever_the_order_and_the_bad_copies() -> None:
    """The payload's sha256 comes from the parts as they arrive (no second pass over the model after the last byte),
    and stays right through what a chain can do to it: chunks out of order, a bad copy discarded, a chunk started
    again by a new parent, a chunk that came verified from elsewhere over unverified bytes."""
    in_order = ChunkBook(MANIFEST)
    for index in range(4):
        assert in_order.digest() is None
        _feed(in_order, index, CHUNKS[index])
    assert in_order.digest() == MANIFEST.sha256

    book = ChunkBook(MANIFEST)
    _feed(book, 2, CHUNKS[2])  # ahead of its turn: hashed when the chunks before it are in
    book.add_part(0, 0, CHUNKS[0][:PART], peer="p")
    with pytest.raises(SnapshotError):  # a bad copy of chunk 0, fed to the digest part by part, discarded
        book.add_part(0, PART, b"x" * (CHUNK - PART), peer="p")
    book.add_part(0, 0, b"y" * PART, peer="p")
    _feed(book, 0, CHUNKS[0])  # a new parent starts it again at 0, over bytes already fed
    book.add_part(1, 0, b"z" * PART, peer="p")
    book.verified(1, CHUNKS[1])  # the good copy from the fallback, over unverified bad bytes
    assert book.digest() is None  # chunk 3 missing
    book.verified(3, CHUNKS[3])
    assert book.digest() == MANIFEST.sha256
    relay = SnapshotRelay(MANIFEST, worker_id=RELAY, chunks=CHUNKS)
    assert relay.ordered() == [CHUNKS[i] for i in range(4)]


def test_a_payload_whose_digest_differs_from_the_manifest_is_not_installed() -> None:
    with pytest.raises(SnapshotError, match="payload sha256 mismatch"):
        ordered_chunks(MANIFEST, CHUNKS, digest="0" * 64)
    assert ordered_chunks(MANIFEST, CHUNKS, digest=MANIFEST.sha256) == [CHUNKS[i] for i in range(4)]


def test_a_part_declaring_more_than_is_left_of_its_chunk_is_refused_unread() -> None:
    relay = SnapshotRelay(MANIFEST, worker_id=RELAY)
    header = framing.chunk(job_id=JOB, version=VERSION, index=0, size=CHUNK, offset=PART, sha256="0" * 64)
    assert relay._declared_size(header) == CHUNK - PART

    async def read() -> None:
        reader = asyncio.StreamReader()
        reader.feed_data(framing.encode_head(header, CHUNK))  # the prefix and header only: no payload follows
        await framing.read_frame(reader, peer="parent", timeout=1, max_payload=relay._declared_size)

    with pytest.raises(framing.FrameError, match=f"declared a {CHUNK}-byte payload for a chunk frame, which takes "
                                                 f"at most {CHUNK - PART}"):
        asyncio.run(read())
    with pytest.raises(framing.FrameError, match="offset -1 is negative"):
        framing.encode_frame(header | {"offset": -1, "size": 1}, b"x")


async def silent_child(relay: SnapshotRelay) -> list[int]:
    """A child that says hello and then reads nothing for a second: the parent's write buffer over that time."""
    hub, port = await start(relay)
    reader, writer = await framing.open_peer("127.0.0.1", port, timeout=5)
    await framing.write_frame(writer, framing.hello(job_id=JOB, version=VERSION, worker_id=CHILD, have=[],
                                                    credential=cred(CHILD)), peer="relay", timeout=5)
    sizes = []
    for _ in range(100):
        await asyncio.sleep(0.01)
        sizes += [s.writer.transport.get_write_buffer_size() for s in relay._sessions.values()]
    writer.close()
    await hub.close()
    return sizes


def test_a_child_that_reads_nothing_holds_its_parent_to_a_bounded_buffer() -> None:
    big = os.urandom(32 << 20)  # more than loopback's socket buffers take
    manifest = build_manifest(big, job_id=JOB, version=VERSION, chunk_bytes=4 << 20)
    relay = SnapshotRelay(manifest, chunks=dict(enumerate(split(big, 4 << 20))), worker_id=0, secret=SECRET)
    sizes = asyncio.run(silent_child(relay))
    assert sizes, "the child was never served"
    # asyncio's high-water mark (64 KiB) plus the one piece written past it, never the 32 MiB owed
    assert max(sizes) <= 64 * 1024 + PIECE_BYTES, max(sizes)
