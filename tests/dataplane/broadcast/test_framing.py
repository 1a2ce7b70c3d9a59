"""Chunk stream framing: frames round-trip, bad bytes and silent or vanished peers are reported by name."""

from __future__ import annotations

import asyncio
import hashlib
import struct

import pytest

from dataplane.broadcast import framing
from dataplane.broadcast.framing import FrameError, PeerClosed, PeerStalled


def reader_of(data: bytes, *, eof: bool = True) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    if eof:
        reader.feed_eof()
    return reader


async def test_chunk_and_hello_frames_round_trip():
    data = bytes(range(256)) * 1000
    header = framing.chunk(job_id=7, version=2, index=5, size=len(data), sha256=hashlib.sha256(data).hexdigest())
    hello = framing.hello(job_id=7, version=2, worker_id=11, have=[3, 1, 2], credential="e2t1.token")
    reader = reader_of(framing.encode_frame(header, data) + framing.encode_frame(hello))
    frame = await framing.read_frame(reader, peer="p", timeout=1)
    assert frame.header == header and frame.payload == data
    frame = await framing.read_frame(reader, peer="p", timeout=1)
    assert frame.type == "hello" and frame.header["have"] == [1, 2, 3] and frame.payload == b""
    assert frame.header["credential"] == "e2t1.token"
    with pytest.raises(PeerClosed, match="p closed the stream"):
        await framing.read_frame(reader, peer="p", timeout=1)


async def test_truncated_frame_is_rejected():
    raw = framing.encode_frame(framing.want([1, 2]))
    with pytest.raises(FrameError, match="truncated"):
        await framing.read_frame(reader_of(raw[:-3]), peer="peer 1.2.3.4:5", timeout=1)


async def test_garbage_and_oversized_frames_are_rejected():
    with pytest.raises(FrameError, match="not a frame"):
        await framing.read_frame(reader_of(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"), peer="p", timeout=1)
    too_big = struct.pack(">4sIQ", framing.MAGIC, 2, framing.MAX_PAYLOAD_BYTES + 1) + b"{}"
    with pytest.raises(FrameError, match="payload"):
        await framing.read_frame(reader_of(too_big), peer="p", timeout=1)
    huge_header = struct.pack(">4sIQ", framing.MAGIC, framing.MAX_HEADER_BYTES + 1, 0)
    with pytest.raises(FrameError, match="header"):
        await framing.read_frame(reader_of(huge_header), peer="p", timeout=1)
    not_json = struct.pack(">4sIQ", framing.MAGIC, 4, 0) + b"\xff\xfe{{"
    with pytest.raises(FrameError, match="not JSON"):
        await framing.read_frame(reader_of(not_json), peer="p", timeout=1)


@pytest.mark.parametrize("header, payload, match", [
    ({"type": "launch"}, b"", "unknown frame type"),
    ({"type": "hello", "job_id": 1, "version": 1, "have": []}, b"", "worker_id"),
    ({"type": "hello", "job_id": 1, "version": 1, "worker_id": 2, "have": [], "credential": 42}, b"", "credential"),
    ({"type": "chunk", "job_id": 1, "version": 1, "index": 0, "size": 9, "sha256": "0" * 64}, b"abc", "size 9"),
    ({"type": "chunk", "job_id": 1, "version": 1, "index": 0, "size": 3, "sha256": "zz"}, b"abc", "sha256"),
    ({"type": "want", "indices": [-1]}, b"", "indices"),
    ({"type": "refuse", "reason": "no"}, b"abc", "no payload"),
])
async def test_frames_with_bad_headers_are_rejected(header, payload, match):
    import json

    raw = json.dumps(header).encode()
    frame = struct.pack(">4sIQ", framing.MAGIC, len(raw), len(payload)) + raw + payload
    with pytest.raises(FrameError, match=match):
        await framing.read_frame(reader_of(frame), peer="p", timeout=1)
    with pytest.raises(FrameError, match=match):
        framing.encode_frame(header, payload)


async def test_a_silent_peer_is_reported_as_stalled_by_name():
    with pytest.raises(PeerStalled, match="parent 10.0.0.9:7000 stalled"):
        await framing.read_frame(reader_of(b"", eof=False), peer="parent 10.0.0.9:7000", timeout=0.1)


async def test_frames_cross_a_real_socket():
    got: list[framing.Frame] = []

    async def handle(reader, writer):
        got.append(await framing.read_frame(reader, peer="client", timeout=2))
        await framing.write_frame(writer, framing.refuse("version 9 not assigned"), peer="client", timeout=2)
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    reader, writer = await framing.open_peer("127.0.0.1", server.sockets[0].getsockname()[1], timeout=2)
    await framing.write_frame(writer, framing.hello(job_id=1, version=9, worker_id=4, have=[]), peer="s", timeout=2)
    reply = await framing.read_frame(reader, peer="s", timeout=2)
    writer.close()
    server.close()
    assert got[0].header["worker_id"] == 4
    assert reply.type == "refuse" and reply.header["reason"] == "version 9 not assigned"


async def test_connecting_to_a_closed_port_names_the_peer():
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    with pytest.raises(PeerClosed, match=f"127.0.0.1:{port} unreachable"):
        await framing.open_peer("127.0.0.1", port, timeout=2)


class _Recording:
    """A StreamWriter stand-in that keeps each write apart (what goes to the socket in one send)."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data) -> None:
        self.writes.append(bytes(data))

    async def drain(self) -> None:
        return None


async def test_a_part_leaves_in_one_write_with_its_head_and_a_stalled_header_names_the_peer():
    """One send per piece, the frame's head in front of the first: no lone ~100-byte segment ahead of each part
    on the wire, and one drain per part (issue 49: the relay's cost per part)."""
    data = bytes(range(256)) * 600  # 153,600 bytes: three pieces of at most 64 KiB
    header = framing.chunk(job_id=7, version=2, index=5, size=len(data), sha256=hashlib.sha256(data).hexdigest())
    out = _Recording()
    await framing.write_frame(out, header, data, peer="child", timeout=1)
    assert len(out.writes) == 3 and len(out.writes[0]) > framing.PIECE_BYTES
    assert b"".join(out.writes) == framing.encode_frame(header, data)
    idle = _Recording()
    await framing.write_frame(idle, framing.idle(), peer="child", timeout=1)
    assert idle.writes == [framing.encode_frame(framing.idle())]
    head = framing.encode_frame(header, data)[:20]  # the prefix and a few bytes of the header, then silence
    with pytest.raises(PeerStalled, match="parent 10.0.0.9:7000 stalled: nothing received for 0.1 s"):
        await framing.read_frame(reader_of(head, eof=False), peer="parent 10.0.0.9:7000", timeout=0.1)

