"""Framed chunk streams between snapshot relays (paper section 4.2).

A frame is ``MAGIC | u32 header length | u64 payload length | header JSON | payload``. Frame types:

- ``hello``  (child -> parent): ``job_id, version, worker_id, have`` (chunk indices it already holds, so a
  transfer resumes after a parent switch or a reconnect) and ``credential``, the child's transfer credential
  (:mod:`dataplane.credentials`); a hello without one is refused by the relay, with the reason. ``manifest``
  (true): the child has no manifest yet and asks for it in the ``accept``.
- ``accept`` (parent -> child): ``job_id, version, chunks``; its payload, only when the hello asked for it, is the
  version's manifest as canonical JSON (:func:`dataplane.snapshot.canonical_manifest`), which the child uses only if
  it hashes to the reference the site announced. A parent still waiting for its own manifest sends ``idle``
  frames before its ``accept``.
- ``chunk``  (parent -> child): ``job_id, version, index, size, sha256`` and ``offset`` (0 when absent); the payload
  is bytes ``offset .. offset + size`` of chunk ``index``: a whole chunk, or one part of it, so a relay forwards a
  chunk in parts as they arrive (cut-through) rather than after all of it (:mod:`dataplane.broadcast.assembly`).
- ``want``   (child -> parent): ``indices`` to send again (a chunk that failed its hash).
- ``refuse`` (either way): ``reason``; the sender closes the stream after it.
- ``bye``    (child -> parent): the child holds every chunk; the parent may close.

Every read, write and connect has a timeout; a stalled or vanished peer raises a :class:`TransferError`
whose message names the peer. Reads and writes take an optional
:class:`~dataplane.broadcast.ratelimit.TokenBucket` that caps the link. No Django, no torch: the agent, the
learner and the benchmark all use this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .ratelimit import PIECE_BYTES, TokenBucket

MAGIC = b"E2SF"
_PREFIX = struct.Struct(">4sIQ")
MAX_HEADER_BYTES = 1 << 20
"""A ``hello`` lists the chunks a child has: 1 MiB holds ~150k indices (a 600 GB snapshot in 4 MiB chunks)."""
MAX_PAYLOAD_BYTES = 256 << 20
"""The largest payload any frame may declare; a reader that knows better (a child knows each chunk's size from its
manifest, a parent expects no payload from its child) passes its own ``max_payload``."""
PayloadLimit = int | Callable[[dict[str, Any]], int]
"""The most payload bytes a reader takes: a number, or a function of the frame's (valid) header."""

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_REQUIRED: dict[str, dict[str, type | tuple[type, ...]]] = {
    "hello": {"job_id": int, "version": int, "worker_id": int, "have": list},
    "accept": {"job_id": int, "version": int, "chunks": int},
    "chunk": {"job_id": int, "version": int, "index": int, "size": int, "sha256": str},
    "want": {"indices": list},
    "refuse": {"reason": str},
    "bye": {},
    "idle": {},  # the parent is alive and waiting for its own parent: a frozen one sends nothing at all
}
_OPTIONAL: dict[str, dict[str, type]] = {"hello": {"credential": str, "partial": list, "manifest": bool},
                                         "chunk": {"offset": int}}
_CARRIES_PAYLOAD = ("chunk", "accept")  # an accept's payload: the manifest, when the hello asked for it
DEFAULT_PART_BYTES = 64 << 10
"""A relay sends a chunk in frames of at most this many payload bytes and forwards each as soon as it holds it, so a
hop adds a part's time, not a chunk's (docs/broadcast.md "Pipelining on long links"). 64 KiB, the read piece
(:data:`~.ratelimit.PIECE_BYTES`): on the WAN bench's 50 Mbit/s links with M = 65.5 MB, 256 KiB parts let each relayed
hop fall 0.30 s behind its parent and 64 KiB parts 0.18 s (T_bcast 1.24 -> 1.18 x M/Bw at N = 8; docs/wan.md)."""


class TransferError(Exception):
    """A chunk stream failed; ``str(err)`` names the peer and the reason."""


class FrameError(TransferError):
    """Bytes that are not a valid frame (garbage, truncated, oversized, missing fields)."""


class PeerStalled(TransferError):
    """The peer sent or accepted nothing within the timeout."""


class PeerClosed(TransferError):
    """The peer closed the stream between frames."""


class PeerRefused(TransferError):
    """The peer sent a ``refuse`` frame; ``reason`` is its text."""

    def __init__(self, peer: str, reason: str) -> None:
        super().__init__(f"{peer} refused: {reason}")
        self.peer, self.reason = peer, reason


@dataclass(frozen=True)
class Frame:
    header: dict[str, Any]
    payload: bytes = b""

    @property
    def type(self) -> str:
        return self.header["type"]


def encode_frame(header: dict[str, Any], payload: bytes | memoryview = b"") -> bytes:
    return encode_head(header, len(payload)) + bytes(payload)


def encode_head(header: dict[str, Any], payload_len: int) -> bytes:
    """The prefix and header of a frame whose payload has ``payload_len`` bytes (sent after it, uncopied)."""
    validate_header(header, payload_len)
    raw = json.dumps(header, separators=(",", ":")).encode()
    if len(raw) > MAX_HEADER_BYTES:
        raise FrameError(f"header of {len(raw)} bytes exceeds {MAX_HEADER_BYTES}")
    return _PREFIX.pack(MAGIC, len(raw), payload_len) + raw


def validate_header(header: Any, payload_len: int) -> None:
    if not isinstance(header, dict) or header.get("type") not in _REQUIRED:
        kind = header.get("type") if isinstance(header, dict) else type(header).__name__
        raise FrameError(f"unknown frame type {kind!r}")
    for key, kind in _REQUIRED[header["type"]].items():
        value = header.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise FrameError(f"{header['type']} frame: field {key!r} missing or not {kind.__name__}")
    for key, kind in _OPTIONAL.get(header["type"], {}).items():
        value = header.get(key)
        if value is not None and (not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool)):
            raise FrameError(f"{header['type']} frame: field {key!r} is not {kind.__name__}")
    if header["type"] == "chunk":
        if header["size"] != payload_len or header["index"] < 0:
            raise FrameError(f"chunk frame: size {header['size']} but payload has {payload_len} bytes")
        if header.get("offset", 0) < 0:
            raise FrameError(f"chunk frame: offset {header['offset']} is negative")
        if not _SHA256.match(header["sha256"]):
            raise FrameError("chunk frame: sha256 is not 64 hex digits")
    elif payload_len and header["type"] not in _CARRIES_PAYLOAD:
        raise FrameError(f"{header['type']} frame carries no payload, got {payload_len} bytes")
    for key in ("have", "indices"):
        if key in header and not all(isinstance(i, int) and i >= 0 for i in header[key]):
            raise FrameError(f"{header['type']} frame: {key!r} must list chunk indices")
    if header["type"] == "hello" and not all(
            isinstance(p, list) and len(p) == 2 and all(type(n) is int and n >= 0 for n in p)
            for p in header.get("partial") or []):
        raise FrameError("hello frame: 'partial' must list [chunk index, bytes held] pairs")


async def read_frame(reader: asyncio.StreamReader, *, peer: str, timeout: float,
                     max_payload: PayloadLimit = MAX_PAYLOAD_BYTES, downlink: TokenBucket | None = None) -> Frame:
    """Read one frame; ``timeout`` bounds every read (a stall mid-payload is detected too). A payload declared
    over ``max_payload`` (given the header, when it is a function) is refused before a byte of it is read."""
    try:
        async with asyncio.timeout(timeout):  # the prefix and the header, sent together: one timer for both
            prefix = await _read_exactly(reader, _PREFIX.size, peer=peer, timeout=None, between_frames=True)
            magic, header_len, payload_len = _PREFIX.unpack(prefix)
            if magic != MAGIC:
                raise FrameError(f"{peer} sent bytes that are not a frame (magic {magic!r})")
            if header_len > MAX_HEADER_BYTES:
                raise FrameError(f"{peer} sent a {header_len}-byte header (limit {MAX_HEADER_BYTES})")
            if payload_len > MAX_PAYLOAD_BYTES:
                raise FrameError(f"{peer} sent a {payload_len}-byte payload (limit {MAX_PAYLOAD_BYTES})")
            raw = await _read_exactly(reader, header_len, peer=peer, timeout=None)
    except TimeoutError:
        raise PeerStalled(f"{peer} stalled: nothing received for {timeout:g} s") from None
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise FrameError(f"{peer} sent a header that is not JSON") from None
    try:
        validate_header(header, payload_len)
    except FrameError as err:
        raise FrameError(f"{peer}: {err}") from None
    limit = max_payload(header) if callable(max_payload) else max_payload
    if payload_len > limit:
        raise FrameError(f"{peer} declared a {payload_len}-byte payload for a {header['type']} frame, which takes at "
                         f"most {limit}")
    parts: list[bytes] = []
    left = payload_len
    while left:
        n = min(left, PIECE_BYTES)
        if downlink is not None:
            await downlink.acquire(n)
        parts.append(await _read_exactly(reader, n, peer=peer, timeout=timeout))
        left -= n
    return Frame(header, b"".join(parts))


async def _read_exactly(reader: asyncio.StreamReader, n: int, *, peer: str, timeout: float | None,
                        between_frames: bool = False) -> bytes:
    """``timeout`` None: the caller's own timer bounds this read."""
    try:
        async with asyncio.timeout(timeout):  # not wait_for: no task per read (the loop's wake-ups cost)
            return await reader.readexactly(n)
    except TimeoutError:
        raise PeerStalled(f"{peer} stalled: nothing received for {timeout:g} s") from None
    except asyncio.IncompleteReadError as err:
        if between_frames and not err.partial:
            raise PeerClosed(f"{peer} closed the stream") from None
        raise FrameError(f"{peer} sent a truncated frame ({len(err.partial)} of {n} bytes)") from None
    except (ConnectionError, OSError) as err:
        raise PeerClosed(f"{peer} connection lost: {err}") from None


async def write_frame(writer: asyncio.StreamWriter, header: dict[str, Any], payload: bytes | memoryview = b"", *,
                      peer: str, timeout: float, uplink: TokenBucket | None = None) -> None:
    """Write one frame, the payload in rate-limited pieces; ``timeout`` bounds each drain (the flow control: a
    slow reader holds us at one piece beyond the transport's high-water mark, never more)."""
    head = encode_head(header, len(payload))
    view = memoryview(payload)
    for start in range(0, len(view), PIECE_BYTES):
        piece = view[start : start + PIECE_BYTES]
        if uplink is not None:
            await uplink.acquire(len(piece))
        # The head goes with the first piece, in one write: one send and one drain per part, and no lone ~100-byte
        # segment ahead of every part on the wire (issue 49).
        await _send(writer, head + piece if head else piece, peer=peer, timeout=timeout)
        head = b""
    if head:  # no payload
        await _send(writer, head, peer=peer, timeout=timeout)


async def _send(writer: asyncio.StreamWriter, data: bytes | memoryview, *, peer: str, timeout: float) -> None:
    try:
        writer.write(data)
        async with asyncio.timeout(timeout):
            await writer.drain()
    except TimeoutError:
        raise PeerStalled(f"{peer} stalled: took nothing for {timeout:g} s") from None
    except (ConnectionError, OSError) as err:
        raise PeerClosed(f"{peer} connection lost: {err}") from None


async def open_peer(host: str, port: int, *, timeout: float) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    try:
        async with asyncio.timeout(timeout):
            return await asyncio.open_connection(host, port)
    except TimeoutError:
        raise PeerStalled(f"{host}:{port} did not accept a connection within {timeout:g} s") from None
    except OSError as err:
        raise PeerClosed(f"{host}:{port} unreachable: {err.strerror or err}") from None


def peer_name(writer: asyncio.StreamWriter) -> str:
    addr = writer.get_extra_info("peername")
    return f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) else str(addr)


async def refuse_and_close(writer: asyncio.StreamWriter, reason: str, *, peer: str, timeout: float) -> None:
    """Tell the peer why (best effort: it may be gone already), then hang up."""
    with contextlib.suppress(TransferError):
        await write_frame(writer, refuse(reason), peer=peer, timeout=timeout)
    writer.close()


# ---- frame constructors -------------------------------------------------------------------------


def hello(*, job_id: int, version: int, worker_id: int, have: list[int], credential: str | None = None,
          partial: dict[int, int] | None = None, manifest: bool = False) -> dict[str, Any]:
    """``have``: the chunks the child holds verified; ``partial``: the leading bytes it holds of others (from an
    earlier parent), which a parent that understands it does not send again; ``manifest``: send the manifest with
    the ``accept``."""
    header = {"type": "hello", "job_id": job_id, "version": version, "worker_id": worker_id, "have": sorted(have)}
    if partial:
        header["partial"] = [[index, held] for index, held in sorted(partial.items())]
    if manifest:
        header["manifest"] = True
    return header | ({"credential": credential} if credential else {})


def accept(*, job_id: int, version: int, chunks: int) -> dict[str, Any]:
    return {"type": "accept", "job_id": job_id, "version": version, "chunks": chunks}


def chunk(*, job_id: int, version: int, index: int, sha256: str, size: int, offset: int = 0) -> dict[str, Any]:
    """Bytes ``offset .. offset + size`` of chunk ``index`` (its whole ``sha256`` from the manifest)."""
    header = {"type": "chunk", "job_id": job_id, "version": version, "index": index, "size": size, "sha256": sha256}
    return header | ({"offset": offset} if offset else {})


def want(indices: list[int]) -> dict[str, Any]:
    return {"type": "want", "indices": list(indices)}


def refuse(reason: str) -> dict[str, Any]:
    return {"type": "refuse", "reason": reason}


def idle() -> dict[str, Any]:
    return {"type": "idle"}


def bye() -> dict[str, Any]:
    return {"type": "bye"}
