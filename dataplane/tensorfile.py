"""The safetensors layout, written and read a tensor at a time, without torch (huggingface.co/docs/safetensors).

A payload is 8 bytes, the little-endian length ``N`` of the header; ``N`` bytes of JSON, ``{name: {"dtype",
"shape", "data_offsets": [begin, end]}}`` (offsets from the end of the header), padded with spaces to a multiple
of 8; then the tensors' bytes back to back, in header order. The learner writes :func:`header` and then each
tensor's bytes into a :class:`~dataplane.snapshot.ChunkCutter` (no whole-model bytes object: what
``safetensors.torch.save`` would build); ``safetensors.torch.load`` reads the result like any file. A receiver
reads the header of a payload it holds as chunks with :func:`layout` and each tensor's bytes with
:meth:`ChunkedPayload.read`.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .snapshot import SnapshotError

DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4,
               "I64": 8, "U64": 8, "F64": 8}
MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    """The safetensors name of the dtype: BF16, F32, I64, ..."""
    shape: tuple[int, ...]
    begin: int = 0
    """Offset of its first byte in the payload (set by :func:`layout`)."""

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPE_BYTES[self.dtype]


def header(tensors: Sequence[TensorInfo], metadata: Mapping[str, str] | None = None) -> bytes:
    """The header of a payload holding ``tensors``' bytes back to back, in this order; ``metadata`` (strings, as
    safetensors wants) joins its ``__metadata__`` (an adapter's settings: dataplane/lora.py)."""
    entries: dict[str, dict] = {"__metadata__": {"format": "pt", **(metadata or {})}}
    offset = 0
    for info in tensors:
        if info.dtype not in DTYPE_BYTES:
            raise SnapshotError(f"tensor {info.name}: dtype {info.dtype} has no safetensors name")
        entries[info.name] = {"dtype": info.dtype, "shape": list(info.shape),
                              "data_offsets": [offset, offset + info.nbytes]}
        offset += info.nbytes
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)
    return struct.pack("<Q", len(text)) + text


class ChunkedPayload:
    """A payload held as its chunks (all ``chunk_bytes`` long but the last), read by offset without joining it."""

    def __init__(self, chunks: Sequence[bytes], chunk_bytes: int) -> None:
        self.chunks, self.chunk_bytes = chunks, chunk_bytes
        self.size = sum(len(chunk) for chunk in chunks)

    def read(self, offset: int, size: int) -> bytes | memoryview:
        """``size`` bytes from ``offset``: a view into one chunk, or a copy where they span several."""
        if offset < 0 or size < 0 or offset + size > self.size:
            raise SnapshotError(f"bytes {offset}..{offset + size} are outside a payload of {self.size}")
        first, start = divmod(offset, self.chunk_bytes)
        if start + size <= self.chunk_bytes:
            return memoryview(self.chunks[first])[start:start + size] if size else b""
        parts, left, index = [], size, first
        while left:
            part = memoryview(self.chunks[index])[start:start + left]
            parts.append(part)
            left -= len(part)
            index, start = index + 1, 0
        return b"".join(parts)


def metadata(payload: ChunkedPayload) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors payload ({} when it has none); :class:`SnapshotError` for a header
    that is not one."""
    entries = _header_entries(payload)
    found = entries.get("__metadata__") or {}
    if not isinstance(found, dict) or not all(isinstance(v, str) for v in found.values()):
        raise SnapshotError("safetensors __metadata__ must map names to strings")
    return found


def _header_entries(payload: ChunkedPayload) -> dict:
    if payload.size < 8:
        raise SnapshotError(f"a safetensors payload has an 8-byte header length; this one has {payload.size} bytes")
    (length,) = struct.unpack("<Q", payload.read(0, 8))
    if length > min(MAX_HEADER_BYTES, payload.size - 8):
        raise SnapshotError(f"safetensors header of {length} bytes in a payload of {payload.size}")
    try:
        entries = json.loads(bytes(payload.read(8, length)))
    except ValueError as err:
        raise SnapshotError(f"not a safetensors header: {err}") from None
    if not isinstance(entries, dict):
        raise SnapshotError("not a safetensors header: not a JSON object")
    return entries


def layout(payload: ChunkedPayload) -> list[TensorInfo]:
    """The tensors of a safetensors payload, in payload order, each with its ``begin``; :class:`SnapshotError`
    for a header that is not one (too long, not JSON, offsets that overlap, leave gaps or run past the end)."""
    entries = _header_entries(payload)
    (length,) = struct.unpack("<Q", payload.read(0, 8))
    try:
        infos = sorted((TensorInfo(name, e["dtype"], tuple(int(d) for d in e["shape"]),
                                   8 + length + int(e["data_offsets"][0]))
                        for name, e in entries.items() if name != "__metadata__"), key=lambda t: t.begin)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as err:
        raise SnapshotError(f"not a safetensors header: {err}") from None
    position = 8 + length
    for info in infos:
        if info.dtype not in DTYPE_BYTES or info.begin != position:
            raise SnapshotError(f"tensor {info.name}: dtype {info.dtype} at byte {info.begin}, expected a known "
                                f"dtype at byte {position}")
        position += info.nbytes
    if position != payload.size:
        raise SnapshotError(f"the tensors end at byte {position} of a payload of {payload.size}")
    return infos
