"""The source side of a :class:`~dataplane.broadcast.relay.SnapshotRelay`: admitting a child and streaming it the
chunks it lacks, each part the moment this relay holds it (cut-through; docs/broadcast.md "Pipelining on long
links"). Admission (docs/trust.md): a child's ``hello`` must carry a credential the relay can check, with the job's
secret (the learner) or against the sha256 the site issued for that child (an agent relay); a refused hello
never touches a session in progress. A child admitted before this relay has its manifest is sent ``idle`` frames
until it has, and gets the manifest in its ``accept`` if its hello asked (docs/broadcast.md "The manifest by
reference"). The child side (receiving, verifying, repair) stays in :mod:`.relay`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .. import credentials
from ..credentials import CredentialError
from ..snapshot import Manifest
from . import framing
from .assembly import ChunkBook
from .framing import Frame, TransferError
from .ratelimit import TokenBucket
from .relaystate import KEEPALIVE_S, RelayStats, RelayTimeouts, Waiters

log = logging.getLogger("echo2.relay")


@dataclass
class Session:
    """One child's stream: who it is, where its bytes go, and the event that wakes its sender."""

    worker_id: int
    writer: asyncio.StreamWriter
    wake: asyncio.Event = field(default_factory=asyncio.Event)


class ServesChildren:
    """What a relay does for its children; mixed into :class:`~dataplane.broadcast.relay.SnapshotRelay`, which
    holds the state named below."""

    manifest: Manifest | None
    worker_id: int
    job_id: int
    version: int
    max_children: int
    secret: str | None
    part_bytes: int
    uplink: TokenBucket | None
    timeouts: RelayTimeouts
    stats: RelayStats
    _book: ChunkBook
    _sessions: dict[int, Session]
    _waiters: Waiters
    _assigned: dict[int, set[str]] | None
    _abandoned: str | None

    def _emit(self, event: str, **fields: Any) -> None:
        raise NotImplementedError

    def manifest_json(self) -> bytes:
        raise NotImplementedError

    async def serve_child(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, hello: Frame) -> None:
        """Stream the chunks the child lacks, each as soon as this relay has it. Called by :class:`RelayHub`."""
        peer = framing.peer_name(writer)
        child = hello.header["worker_id"]
        # Not assigned (yet): wait a little for the site's word to reach this relay too.
        await self._waiters.wait_until(lambda: self._assigned is None or child in self._assigned,
                                       self.timeouts.assign_wait)
        reason = self._admission(child, hello.header.get("credential"))
        if reason:
            # Nothing of a refused hello touches the sessions: an impostor cannot close the real child's stream.
            self.stats.refused += 1
            log.warning("relay of worker %s (job %s v%s) refused %s claiming worker %s: %s", self.worker_id,
                        self.job_id, self.version, peer, child, reason)
            await framing.refuse_and_close(writer, reason, peer=peer, timeout=self.timeouts.connect)
            self._emit("refused", peer=peer, child=child, reason=reason)
            return
        old = self._sessions.pop(child, None)
        if old is not None:  # the same child (its credential proves it) reconnected: its old stream is dead to it
            old.writer.close()
        session = self._sessions[child] = Session(child, writer)
        wants: deque[int] = deque()
        listener: asyncio.Task | None = None
        try:
            if self.manifest is None:
                await self._wait_for_manifest(writer, session, peer)
            listener = asyncio.create_task(self._listen(reader, session, wants, peer))
            sent = self.manifest_json() if hello.header.get("manifest") else b""
            await framing.write_frame(writer, framing.accept(job_id=self.job_id, version=self.version,
                                                             chunks=len(self.manifest.chunks)), sent,
                                       peer=peer, timeout=self.timeouts.stall, uplink=self.uplink if sent else None)
            self.stats.manifests_sent += bool(sent)
            self.stats.children_served += 1
            await self._stream(writer, session, listener, wants, set(hello.header["have"]),
                               self._resume_points(hello.header.get("partial")), peer)
        except TransferError as err:
            self.stats.child_failures += 1
            self._emit("child_failed", child=child, reason=str(err))
        finally:
            if listener is not None:
                listener.cancel()
            if self._sessions.get(child) is session:
                del self._sessions[child]
            writer.close()

    async def _wait_for_manifest(self, writer: asyncio.StreamWriter, session: Session, peer: str) -> None:
        """Hold an admitted child until this relay has its manifest (from its own parent, or its fallback), telling it
        every ``KEEPALIVE_S`` that we are alive (a frozen relay sends nothing: its child's stall timeout tells);
        refuse it when the relay gave the version up or after ``give_up`` seconds."""
        deadline = time.monotonic() + self.timeouts.give_up
        while self.manifest is None:
            reason = self._abandoned or (f"worker {self.worker_id} has had no manifest of job {self.job_id} version "
                                         f"{self.version} for {self.timeouts.give_up:g} s"
                                         if time.monotonic() > deadline else None)
            if reason:
                await framing.refuse_and_close(writer, reason, peer=peer, timeout=self.timeouts.connect)
                raise TransferError(f"child {peer}: refused: {reason}")
            session.wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(session.wake.wait(), KEEPALIVE_S)
                continue
            await framing.write_frame(writer, framing.idle(), peer=peer, timeout=self.timeouts.stall)

    def _admission(self, child: int, credential: str | None) -> str | None:
        if self._assigned is not None and child not in self._assigned:
            return f"worker {child} is not an assigned child of worker {self.worker_id}"
        try:
            self._check_credential(child, credential)
        except CredentialError as err:
            return f"worker {child}: {err}"
        others = [w for w in self._sessions if w != child]
        if self._assigned is None and len(others) >= self.max_children:
            return f"busy: worker {self.worker_id} already serves {others} (fan-out {self.max_children})"
        return None

    def _check_credential(self, child: int, credential: str | None) -> None:
        """With the job's secret: any valid credential of ``child`` for this version. Without: one whose sha256
        the site gave us for ``child``. Raises :class:`CredentialError` with the reason."""
        scope = {"job_id": self.job_id, "version": self.version, "worker_id": child, "now": time.time()}
        if self.secret:
            credentials.verify(self.secret, credential, **scope)
        elif self._assigned and self._assigned.get(child):
            credentials.verify_issued(credential, self._assigned[child], **scope)
        else:
            credentials.parse(credential)  # "no credential" / "malformed" before "nothing to check against"
            raise CredentialError(f"worker {self.worker_id} holds no credential of worker {child} to check against")

    async def _listen(self, reader: asyncio.StreamReader, session: Session, wants: deque[int], peer: str) -> None:
        """Read the child's ``want``/``bye`` frames; returning (EOF, bye, error) ends the session."""
        try:
            while True:
                frame = await framing.read_frame(reader, peer=peer, timeout=self.timeouts.give_up, max_payload=0)
                if frame.type == "want":
                    room = len(self.manifest.chunks) - len(wants)  # never more asks queued than chunks
                    wants.extend([i for i in frame.header["indices"] if i < len(self.manifest.chunks)][:max(0, room)])
                elif frame.type == "bye":
                    return
                session.wake.set()
        except TransferError:
            return
        finally:
            session.wake.set()

    def _resume_points(self, partial: list[list[int]] | None) -> dict[int, int]:
        """Where to start each chunk the child holds the first bytes of (its hello's ``partial``, from an earlier
        parent); a claim past the chunk's end is ignored. Those bytes are the child's to verify: if the whole does not
        match, it discards the chunk and asks for it again (a ``want``), which starts at 0."""
        chunks = self.manifest.chunks
        return {i: n for i, n in partial or [] if i < len(chunks) and 0 < n < chunks[i].size}

    async def _stream(self, writer: asyncio.StreamWriter, session: Session, listener: asyncio.Task,
                      wants: deque[int], have: set[int], resume: dict[int, int], peer: str) -> None:
        """Send the owed chunks part by part, each part as soon as we hold it (verified or not: cut-through), in
        index order with ``want``s first; a chunk the child holds the first bytes of starts after them (``resume``);
        a chunk whose unverified bytes went bad here starts again at 0."""
        order = [c.index for c in self.manifest.chunks if c.index not in have]
        cursor: tuple[int, int, int] | None = None  # (chunk, next offset, its generation when we started it)
        while True:
            session.wake.clear()
            if listener.done():
                return
            cursor = cursor or self._next_chunk(wants, order, resume)
            if cursor is not None:
                index, offset, generation = cursor
                if self._book.generation[index] != generation:
                    offset, generation = 0, self._book.generation[index]
                held, data = self._book.available(index)
                if self._book.ready(index, offset):
                    end = min(held, offset + self.part_bytes)
                    await self._send_chunk(writer, index, offset, bytes(memoryview(data)[offset:end]), peer=peer)
                    cursor = (index, end, generation) if end < self._book.size(index) else None
                    continue
                cursor = (index, offset, generation)
            # Waiting for our own parent (or, all sent, for the child's want/bye): not the child's fault.
            await self._wait_for_chunks(writer, session, keepalive=bool(order) or cursor is not None, peer=peer)

    def _next_chunk(self, wants: deque[int], order: list[int],
                    resume: dict[int, int]) -> tuple[int, int, int] | None:
        """The next chunk to send a child, with the offset to start at: a ``want`` we hold (some of), from 0; else the
        first owed one we hold some of, after what the child already holds of it."""
        if wants and self._book.ready(wants[0]):
            index = wants.popleft()
            resume.pop(index, None)
            return index, 0, self._book.generation[index]
        index = next((i for i in order if self._book.ready(i)), None)
        if index is None:
            return None
        order.remove(index)
        return index, resume.pop(index, 0), self._book.generation[index]

    async def _wait_for_chunks(self, writer: asyncio.StreamWriter, session: Session, *, keepalive: bool,
                               peer: str) -> None:
        """Wait for a chunk to send (or a word from the child), telling a child still owed chunks that we
        are alive every ``KEEPALIVE_S``; give up after ``give_up`` seconds of nothing."""
        deadline = time.monotonic() + self.timeouts.give_up
        while time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(KEEPALIVE_S):  # not wait_for: no task for every part a chain forwards
                    await session.wake.wait()
                return
            if keepalive:
                await framing.write_frame(writer, framing.idle(), peer=peer, timeout=self.timeouts.stall)
        raise TransferError(f"child {peer}: nothing to send or hear for {self.timeouts.give_up:g} s")

    async def _send_chunk(self, writer: asyncio.StreamWriter, index: int, offset: int, data: bytes, *,
                          peer: str) -> None:
        """Send bytes ``offset ..`` of chunk ``index`` under the manifest's sha256 (the one place bytes leave for a
        child)."""
        header = framing.chunk(job_id=self.job_id, version=self.version, index=index, size=len(data),
                               sha256=self.manifest.chunks[index].sha256, offset=offset)
        await framing.write_frame(writer, header, data, peer=peer, timeout=self.timeouts.stall, uplink=self.uplink)
