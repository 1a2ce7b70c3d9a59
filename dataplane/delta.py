"""Lossless deltas between published versions of a policy (encoding ``xor-zstd``; docs/broadcast.md "Formats").

A delta of version ``v`` against version ``b`` is the XOR of the two full payloads, byte for byte, compressed as
one zstd stream and cut into chunks like any payload. Both payloads are the same safetensors layout (same names,
shapes and dtypes, so the same length and chunk size): where a weight kept its bit pattern the XOR is zero, and
after a small update most bf16 weights keep it (a step at lr 1e-6 moves 2-4 % of them by one or two units in
the last place). Decoding XORs the decompressed stream back into the base's chunks, one chunk at a time, and the
result is checked against the full manifest's sha256: the rebuilt weights are the learner's, bit for bit.

Neither side ever holds more than a chunk of the stream beyond the payloads themselves: the encoder takes the new
version's full chunks as they are cut (with the base's chunk of the same index, read from disk) and emits
compressed bytes; the decoder reads the stream a full chunk at a time, and refuses one that would expand past the
full payload's size (a corrupt or hostile stream cannot make it allocate without bound).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np
import zstandard

from .snapshot import Manifest, SnapshotError

ENCODING = "xor-zstd"
LEVEL = 1  # on these mostly-zero streams level 3 (zstd's default) is no smaller and level 9 only ~8 % smaller


def xor(a: bytes | memoryview, b: bytes | memoryview) -> bytes:
    """``a ^ b``, byte for byte (equal lengths)."""
    if len(a) != len(b):
        raise SnapshotError(f"cannot XOR {len(a)} bytes with {len(b)}")
    return np.bitwise_xor(np.frombuffer(a, dtype=np.uint8), np.frombuffer(b, dtype=np.uint8)).tobytes()


class DeltaEncoder:
    """Feed the new version's full chunks in order (:meth:`add`); each is XORed with the base's chunk of the same
    index (``base_chunks``, in order) and compressed, and the compressed bytes go to ``emit`` as they come (a
    :class:`~dataplane.snapshot.ChunkCutter` cuts them into the delta's chunks). :meth:`finish` flushes."""

    def __init__(self, base_chunks: Iterable[bytes], emit: Callable[[bytes], None], *, level: int = LEVEL) -> None:
        self._base: Iterator[bytes] = iter(base_chunks)
        self._emit = emit
        self._stream = zstandard.ZstdCompressor(level=level).compressobj()
        self.added = 0

    def add(self, chunk: bytes) -> None:
        base = next(self._base, None)
        if base is None:
            raise SnapshotError(f"delta: the new payload has more chunks than its base ({self.added})")
        out = self._stream.compress(xor(chunk, base))
        self.added += 1
        if out:
            self._emit(out)

    def finish(self) -> None:
        if next(self._base, None) is not None:
            raise SnapshotError(f"delta: the base has more chunks than the new payload ({self.added})")
        self._emit(self._stream.flush())


def check_base(delta: Manifest, base: Manifest) -> None:
    """Raise :class:`SnapshotError` unless ``base`` is the full payload ``delta`` applies to."""
    if delta.kind != "delta" or delta.full is None:
        raise SnapshotError(f"version {delta.version} is a {delta.kind} snapshot, not a delta")
    if base.kind != "full" or base.version != delta.base_version or base.sha256 != delta.base_sha256:
        raise SnapshotError(f"version {delta.version} is a delta against version {delta.base_version} "
                            f"(sha256 {delta.base_sha256[:12]}...), not against the {base.kind} version "
                            f"{base.version} (sha256 {base.sha256[:12]}...)")
    full = delta.full
    if (base.total_bytes, base.chunk_bytes) != (full.total_bytes, full.chunk_bytes):
        raise SnapshotError(f"version {delta.version}: {full.total_bytes} bytes in chunks of {full.chunk_bytes}, "
                            f"its base {base.total_bytes} in chunks of {base.chunk_bytes}")


class _ChunkReader:
    """A file-like ``read`` over a sequence of byte strings (the delta's chunks), for zstd's stream reader."""

    def __init__(self, chunks: Sequence[bytes]) -> None:
        self._chunks, self._next, self._current = chunks, 0, memoryview(b"")

    def read(self, size: int = -1) -> bytes:
        while not self._current and self._next < len(self._chunks):
            self._current = memoryview(self._chunks[self._next])
            self._next += 1
        size = len(self._current) if size is None or size < 0 else size
        out, self._current = self._current[:size], self._current[size:]
        return out.tobytes()


def _read_exactly(reader, size: int) -> bytes:
    parts, left = [], size
    while left:
        part = reader.read(left)
        if not part:
            break
        parts.append(part)
        left -= len(part)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def apply_delta(delta: Manifest, delta_chunks: Sequence[bytes], base: Manifest,
                base_chunks: Iterable[bytes]) -> list[bytes]:
    """The full payload of ``delta``'s version, as chunks, rebuilt from the base's full payload: refused
    (:class:`SnapshotError`) unless ``base`` is the one the delta names and the result hashes to the learner's
    digest (``delta.full.sha256``). ``delta_chunks`` are the delta's verified chunks, in order."""
    check_base(delta, base)
    full = delta.full
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(_ChunkReader(delta_chunks), read_across_frames=False)
        out, whole = [], hashlib.sha256()
        for info, base_chunk in zip(full.chunks, base_chunks, strict=True):
            stream = _read_exactly(reader, info.size)
            if len(stream) != info.size:
                raise SnapshotError(f"version {delta.version}: the delta ends before chunk {info.index}")
            chunk = xor(stream, base_chunk)
            whole.update(chunk)
            out.append(chunk)
        if reader.read(1):
            raise SnapshotError(f"version {delta.version}: the delta is longer than the full payload")
    except SnapshotError:
        raise
    except zstandard.ZstdError as err:
        raise SnapshotError(f"version {delta.version}: the delta does not decompress: {err}") from None
    except ValueError as err:  # zip(strict=True): the base held fewer or more chunks than its manifest says
        raise SnapshotError(f"version {delta.version}: the base's chunks do not match its manifest: {err}") from None
    if whole.hexdigest() != full.sha256:
        raise SnapshotError(f"version {delta.version}: the rebuilt payload's sha256 is not the learner's")
    return out
