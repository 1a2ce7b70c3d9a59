"""The chunks a relay holds, verified and in flight: what makes cut-through forwarding safe (docs/broadcast.md
"Pipelining on long links").

A parent sends a chunk in parts (``chunk`` frames with an ``offset``, :data:`~.framing.DEFAULT_PART_BYTES` each), and a
relay forwards each part to its child as soon as it holds it, before the chunk's sha256 can be checked: a relay is
untrusted, so a part is never installed or counted, only passed on. :class:`ChunkBook` keeps the two kinds apart:

- **verified** chunks (:attr:`ChunkBook.done`): every byte arrived and matched the manifest's sha256 (or came
  verified from the fallback); only these are installed, counted and reported.
- **partial** chunks: the leading bytes received so far, in a buffer of the manifest's size for that chunk, hashed
  as they arrive in order (so the last part costs only its own hashing, not the chunk's, at every hop). A part may
  overwrite bytes already held (a new parent starts the chunk again at offset 0; the chunk is then hashed whole at
  the end) but never leave a gap. The last byte arriving verifies the chunk against the manifest: good, it is
  returned for the caller to store; bad, it is discarded and its **generation** goes up, so every child that was
  sent some of those bytes is sent the chunk again from offset 0 (the last part of a chunk reaches children only
  after it verified, so a bad chunk never completes downstream from an honest relay; a lying relay's child finds
  the bad sha256 itself and asks again).

The **whole payload's** sha256 (the manifest's ``sha256``, checked before an install) is fed the same way: every
part that extends the payload's leading bytes in order goes into it as it arrives, so the last byte leaves only the
last part to hash, not the whole model (:meth:`ChunkBook.digest`; issue 49: at 64 MB that was 0.05-0.1 s after the
last byte at every tail). A chunk verified out of order (the fallback, a resume) is fed whole once the chunks before
it are in; bytes fed that turn out bad (a discarded or overwritten chunk) are taken back by restarting from the
digest at that chunk's start.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..snapshot import Manifest, SnapshotError, verify_chunk
from .framing import TransferError


@dataclass
class _Partial:
    buf: bytearray
    filled: int = 0
    hasher: Any = field(default_factory=hashlib.sha256)
    """The sha256 of ``buf[:filled]`` while the parts came in order without overwriting; None after an overwrite."""


class ChunkBook:
    """Chunks of one manifest: verified (``done``) and partial (bytes received, unverified: forwardable only)."""

    def __init__(self, manifest: Manifest) -> None:
        self.manifest = manifest
        self.done: dict[int, bytes] = {}
        self._partial: dict[int, _Partial] = {}
        self.generation: Counter[int] = Counter()
        """Bumped when a chunk's unverified bytes turn out bad: what was forwarded of them must be sent again."""
        self._whole = hashlib.sha256()  # the payload's leading bytes: chunks before _next, then _fed bytes of it
        self._whole_at_next = self._whole.copy()  # the same before chunk _next (what a bad chunk rewinds to)
        self._next, self._fed = 0, 0

    def size(self, index: int) -> int:
        return self.manifest.chunks[index].size

    def available(self, index: int) -> tuple[int, bytes | bytearray]:
        """How many leading bytes of chunk ``index`` may be forwarded now, and the buffer holding them."""
        if index in self.done:
            return len(self.done[index]), self.done[index]
        partial = self._partial.get(index)
        return (partial.filled, partial.buf) if partial is not None else (0, b"")

    def partial(self) -> dict[int, int]:
        """The leading bytes held of each chunk not verified yet (a parent switched mid-chunk resumes after them)."""
        return {index: p.filled for index, p in self._partial.items() if p.filled and index not in self.done}

    def ready(self, index: int, offset: int = 0) -> bool:
        """Whether bytes of chunk ``index`` from ``offset`` on may be forwarded now (an empty chunk once verified)."""
        held, _ = self.available(index)
        return held > offset or (offset == held == 0 and index in self.done)

    def add_part(self, index: int, offset: int, data: bytes, *, peer: str) -> bytes | None:
        """Bytes ``offset ..`` of chunk ``index`` from ``peer``: the whole chunk once its last byte arrived and it
        matched the manifest (for the caller to store, :meth:`verified`), else None. A chunk that did not match is
        discarded (:meth:`discard`) and raises :class:`SnapshotError`; a part that would leave a gap, or run past
        the chunk (the framing refuses that before reading it), raises :class:`TransferError`."""
        size = self.size(index)
        partial = self._partial.get(index)
        if partial is None:
            partial = self._partial[index] = _Partial(bytearray(size))
        if offset > partial.filled or offset + len(data) > size:
            raise TransferError(f"{peer} sent bytes {offset}..{offset + len(data)} of chunk {index} "
                                f"({size} bytes), holding only its first {partial.filled}")
        partial.buf[offset : offset + len(data)] = data
        if partial.hasher is not None and offset == partial.filled:
            partial.hasher.update(data)
        elif offset < partial.filled:
            partial.hasher = None  # bytes overwritten: hash the whole chunk once it is complete
        if index == self._next:
            if offset < self._fed:  # overwritten after being fed: this chunk's part of the digest starts again
                self._rewind()
            if offset == self._fed:
                self._whole.update(data)
                self._fed += len(data)
        partial.filled = max(partial.filled, offset + len(data))
        if partial.filled < size:
            return None
        whole = bytes(partial.buf)
        try:
            if partial.hasher is None:
                verify_chunk(self.manifest, index, whole)
            elif partial.hasher.hexdigest() != self.manifest.chunks[index].sha256:
                raise SnapshotError(f"chunk {index} of version {self.manifest.version}: sha256 mismatch")
        except SnapshotError:
            self.discard(index)  # before the caller awaits anything: no child gets the last part of a bad chunk
            raise
        return whole

    def discard(self, index: int) -> None:
        """Chunk ``index``'s unverified bytes were bad: drop them; children get the chunk again from offset 0."""
        if self._partial.pop(index, None) is not None:
            self.generation[index] += 1
        if index == self._next:
            self._rewind()

    def verified(self, index: int, data: bytes) -> None:
        """Chunk ``index`` holds ``data``, verified. Unverified bytes forwarded before that which differ from it (a
        relay lied; the chunk came verified from elsewhere) make its children get it again from offset 0."""
        partial = self._partial.pop(index, None)
        if partial is not None and partial.buf[: partial.filled] != data[: partial.filled]:
            self.generation[index] += 1
            if index == self._next:
                self._rewind()
        self.done[index] = data
        while self._next in self.done:  # the digest takes each verified chunk in order, the rest of it not fed yet
            chunk = self.done[self._next]
            if self._fed < len(chunk):
                self._whole.update(memoryview(chunk)[self._fed:])
            self._next, self._fed = self._next + 1, 0
            self._whole_at_next = self._whole.copy()

    def digest(self) -> str | None:
        """The sha256 of the verified chunks in order, once every chunk is verified (None before)."""
        return self._whole.hexdigest() if self._next == len(self.manifest.chunks) else None

    def _rewind(self) -> None:
        self._whole, self._fed = self._whole_at_next.copy(), 0
