"""What a delay proxy (bench/wan/proxy.py) sees on the wire, written as JSON lines for the bench to read back:

- ``reply``: on the site's port, each websocket request of an agent (a frame naming an ``id``: ``submit``,
  ``lease_request``, ``trajectories``...) and the site's reply naming it back (``ref_id``): milliseconds from the
  proxy reading the request off the agent's link to the proxy writing the reply onto it. The proxy holds both
  directions for the path's delay, so this is the round trip the agent sees, less its own link's serialisation
  (negligible for these few-KB frames). The site's websocket is plain (daphne offers no compression), client
  frames masked.
- ``ws``: a websocket opened on the site's port (an agent connecting, or reconnecting).
- ``burst``: on a bulk port (the learner's snapshot server and relay hub, the agents' relays), each stretch of
  bytes the peer acknowledged without a pause over ``BURST_GAP_S`` (TCP_INFO ``tcpi_bytes_acked`` of the socket
  towards the peer, sampled every ``SAMPLE_S``): bytes and seconds, so the hop's throughput as the receiver got
  it, not as fast as the proxy could fill its socket buffer.

Times are wall-clock (``time.time()``): the bench lines them up with its faults and the site's records.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import struct
import time
from typing import IO

SAMPLE_S = 0.05
BURST_GAP_S = 0.5
BYTES_ACKED = struct.Struct("=Q")
BYTES_ACKED_OFFSET = 120  # struct tcp_info: tcpi_bytes_acked (Linux >= 4.1)
REQUEST_ID, REPLY_ID, TYPE = re.compile(rb'"id": ?"([^"]{1,64})"'), re.compile(rb'"ref_id": ?"([^"]{1,64})"'), \
    re.compile(rb'"type": ?"(\w{1,40})"')
MAX_HEADER = 64 * 1024


class Tap:
    """One JSON line per record, to ``path`` (appended, line-buffered: a killed proxy loses nothing written)."""

    def __init__(self, path: str, node: str) -> None:
        self.out: IO[str] = open(path, "a", buffering=1)  # noqa: SIM115 - for the proxy's lifetime
        self.node = node

    def write(self, kind: str, **fields) -> None:
        self.out.write(json.dumps({"kind": kind, "node": self.node, **fields}) + "\n")


def unmask(payload: bytes, key: bytes) -> bytes:
    n = len(payload)
    if not n:
        return payload
    mask = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(payload, "little") ^ int.from_bytes(mask, "little")).to_bytes(n, "little")


class Frames:
    """Websocket messages of one direction, from the bytes after the HTTP upgrade (RFC 6455 framing; fragments
    joined, control frames skipped). ``feed`` returns the messages completed by ``data``; a stream that turns out
    not to be a websocket (``server``: no 101; client: no ``Upgrade: websocket``) yields nothing."""

    def __init__(self, *, server: bool) -> None:
        self.server, self.buf, self.parts = server, b"", []
        self.upgraded: bool | None = None  # None: still in the HTTP header; False: not a websocket

    def feed(self, data: bytes) -> list[bytes]:
        if self.upgraded is False:
            return []
        self.buf += data
        if self.upgraded is None:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                self.upgraded = None if len(self.buf) < MAX_HEADER else False
                return []
            header = self.buf[:end].lower()
            self.upgraded = (header.split(b"\r\n", 1)[0].find(b" 101 ") > 0 if self.server
                             else b"upgrade: websocket" in header)
            self.buf = self.buf[end + 4:] if self.upgraded else b""
        out = []
        while len(self.buf) >= 2:
            b0, b1 = self.buf[0], self.buf[1]
            n, pos = b1 & 0x7F, 2
            if n == 126:
                n, pos = int.from_bytes(self.buf[2:4], "big"), 4
            elif n == 127:
                n, pos = int.from_bytes(self.buf[2:10], "big"), 10
            key = None
            if b1 & 0x80:
                key, pos = self.buf[pos:pos + 4], pos + 4
            if len(self.buf) < pos + n:
                break
            payload, self.buf = self.buf[pos:pos + n], self.buf[pos + n:]
            if b0 & 0x08 or b0 & 0x40:  # a control frame (close, ping, pong); RSV1: compressed, not read here
                continue
            self.parts.append(unmask(payload, key) if key else payload)
            if b0 & 0x80:
                out.append(b"".join(self.parts))
                self.parts = []
        return out


class Replies:
    """One proxied websocket connection to the site: requests seen from the agent, replies delivered to it."""

    def __init__(self, tap: Tap, peer: str) -> None:
        self.tap, self.peer = tap, peer
        self.requests, self.replies = Frames(server=False), Frames(server=True)
        self.pending: dict[bytes, tuple[float, bytes]] = {}
        self.opened = False

    def from_client(self, data: bytes) -> None:
        now = time.time()
        for message in self.requests.feed(data):
            rid, kind = REQUEST_ID.search(message), TYPE.search(message)
            if rid:
                self.pending[rid.group(1)] = (now, kind.group(1) if kind else b"?")
        if self.requests.upgraded and not self.opened:
            self.opened = True
            self.tap.write("ws", peer=self.peer, t=now)

    def from_server(self, data: bytes) -> list[bytes]:
        """The request ids that ``data`` answers (to pass to :meth:`delivered` once written to the agent)."""
        return [m.group(1) for message in self.replies.feed(data) if (m := REPLY_ID.search(message))]

    def delivered(self, ids: list[bytes]) -> None:
        now = time.time()
        for rid in ids:
            asked = self.pending.pop(rid, None)
            if asked is not None:
                self.tap.write("reply", peer=self.peer, type=asked[1].decode(), ms=round(1000 * (now - asked[0]), 2),
                               t=now)


def bytes_acked(sock) -> int | None:
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    except OSError:
        return None
    if len(info) < BYTES_ACKED_OFFSET + BYTES_ACKED.size:
        return None
    return BYTES_ACKED.unpack_from(info, BYTES_ACKED_OFFSET)[0]


async def bursts(tap: Tap, sock, *, port: int, peer: str) -> None:
    """Sample what the peer acknowledged on ``sock`` until cancelled; write each burst (bytes, start, end)."""
    last = bytes_acked(sock)
    if last is None:
        return
    start = base = None
    grew = prev = time.time()

    def emit() -> None:
        tap.write("burst", port=port, peer=peer, t0=start, t1=grew, bytes=last - base)

    try:
        while True:
            await asyncio.sleep(SAMPLE_S)
            acked, now = bytes_acked(sock), time.time()
            if acked is None:
                return
            if acked > last:
                if start is None:
                    start, base = prev, last
                grew = now
            elif start is not None and now - grew > BURST_GAP_S:
                emit()
                start = None
            last, prev = acked, now
    finally:
        if start is not None:
            with contextlib.suppress(ValueError):  # the file closed with the interpreter
                emit()
