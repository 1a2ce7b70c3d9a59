"""Peer-assisted pipelined broadcast of a policy snapshot (paper section 4.2, appendix C.3; DESIGN.md step 6).

A :class:`SnapshotRelay` holds one snapshot version of one job. It is both ends of a chain link:

- **source side** (:mod:`.serving`): children connect to it (only relays need an open port; a tail behind NAT only dials
  out) and it streams each chunk in parts of ``part_bytes`` (:data:`~.framing.DEFAULT_PART_BYTES`), each part the
  moment it has it (cut-through: a hop adds a part's time, not a chunk's; the parts of a chunk not yet verified
  are forwarded but never installed, :mod:`.assembly`). An agent relay serves ONE child (fan-out 1); the learner
  runs the same code with ``max_children = N_ch`` seeds and one ``B0`` bucket shared by them.
- **child side**: :meth:`SnapshotRelay.receive` dials the parent, says which chunks it has, verifies every
  chunk against the manifest, asks again for a bad chunk and, after ``bad_chunk_retries`` bad copies or
  ``parent_retries`` failed connections, fetches what is missing from the fallback (the learner's HTTP server:
  ``GET {url}chunks/{i}``). It returns the payload only once every chunk verified and the whole payload hashes
  right. :meth:`set_parent` switches the parent mid-transfer (repair); the transfer resumes from the chunks already
  held.
- **the manifest**: given (the learner's origin, a relay whose agent holds it), or only its reference, the sha256
  and size the site announced (:class:`~dataplane.snapshot.ManifestReference`). Then the relay asks its parent for it
  in its ``hello`` and takes the one in the parent's ``accept`` only if it hashes to that reference: a parent is
  untrusted, and one that sends another manifest is refused and reported (``parent_failed``, as a frozen one: no
  knocking again) while the relay fetches it itself (``manifest_fallback``, else ``GET {url}manifest.json``), as it
  does whenever it must go to the fallback without one. Such a relay is registered with its hub at once; a child
  that knocks before its manifest is in is sent ``idle`` frames until it is, so the manifest goes down a chain hop
  by hop and only the chain's head asks the learner for it (docs/broadcast.md "The manifest by reference").

Admission (docs/trust.md): a child's ``hello`` carries its transfer credential (:mod:`dataplane.credentials`). A
relay that holds the job's secret (the learner's origin) verifies it; an agent relay, which does not, admits a
child only with the very credential the site issued to it (the site sends the relay its sha256 with the
assignment). A claimed worker id alone admits nobody, and a refused hello never touches a session in progress.
Refusals are counted (:attr:`RelayStats.refused`), reported as ``refused`` events and logged with the peer.

A :class:`~dataplane.broadcast.hub.RelayHub` is the one listening port of an agent or learner; it hands each
``hello`` to the relay registered for its (job, version). ``python -m dataplane.broadcast.process --help`` runs
one relay as a process (tests and ``bench/bench_broadcast.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from ..snapshot import (
    MANIFEST_SLACK_BYTES,
    Manifest,
    ManifestReference,
    SnapshotError,
    assemble,
    canonical_manifest,
    is_canonical,
    ordered_chunks,
    verified_manifest,
    verify_chunk,
)
from . import framing
from .assembly import ChunkBook
from .fallback import FallsBack
from .framing import DEFAULT_PART_BYTES, Frame, PeerRefused, PeerStalled, TransferError
from .ratelimit import TokenBucket
from .relaystate import KEEPALIVE_S, RelayStats, RelayTimeouts, Waiters, hand_over_gil_often
from .serving import ServesChildren, Session

__all__ = ["KEEPALIVE_S", "Event", "ManifestRefused", "RelayStats", "RelayTimeouts", "SnapshotRelay", "Waiters"]

Event = dict[str, Any]
log = logging.getLogger("echo2.relay")


class ManifestRefused(TransferError):
    """A parent sent a manifest that is not the one the site announced (or not a manifest at all)."""


class SnapshotRelay(ServesChildren, FallsBack):
    def __init__(self, manifest: Manifest | None, *, worker_id: int, chunks: dict[int, bytes] | None = None,
                 max_children: int = 1, uplink: TokenBucket | None = None, downlink: TokenBucket | None = None,
                 fallback_url: str | None = None, timeouts: RelayTimeouts | None = None,
                 on_event: Callable[[Event], None] | None = None, secret: str | None = None,
                 credential: str | None = None, part_bytes: int = DEFAULT_PART_BYTES,
                 reference: ManifestReference | None = None, job_id: int | None = None, version: int | None = None,
                 manifest_fallback: Callable[[], Awaitable[Manifest]] | None = None,
                 held: Callable[[Manifest], Mapping[int, bytes] | None] | None = None) -> None:
        """``chunks`` given in full makes an origin (the learner). ``secret``: the job's transfer secret, to verify
        children's credentials with (the learner); without it only children the site assigned with the
        sha256 of their credential are admitted. ``credential``: ours, shown to the parent and the fallback.
        ``part_bytes``: the most payload per ``chunk`` frame sent to a child (a chunk's size or more: whole chunks,
        store-and-forward per chunk, as before cut-through).

        ``manifest`` None: only its ``reference`` is known (with ``job_id`` and ``version``); the manifest comes
        from the parent's ``accept``, verified against it, or from ``manifest_fallback`` (the agent's own fetch,
        else ``GET {fallback_url}manifest.json``) when the parent fails or gives none. ``held``: the chunks this
        relay already holds, once it knows the manifest (a cached base), as ``chunks`` does for a manifest given; it may
        refuse the manifest (SnapshotError: the transfer fails)."""
        if part_bytes < 1:
            raise ValueError(f"part_bytes must be at least 1, got {part_bytes}")
        if manifest is None and (reference is None or job_id is None or version is None):
            raise ValueError("a relay without its manifest needs the manifest's reference, the job and the version")
        self.manifest: Manifest | None = None
        self.reference = reference
        self.worker_id, self.max_children = worker_id, max_children
        self.secret = secret
        self.credential = credential  # presented to the current parent: the one the site sent with it
        self.fallback_credential = credential  # the newest the site sent: the learner's server verifies any
        self.job_id = manifest.job_id if manifest is not None else job_id
        self.version = manifest.version if manifest is not None else version
        self.uplink, self.downlink, self.fallback_url = uplink, downlink, fallback_url
        self.timeouts, self.part_bytes = timeouts or RelayTimeouts(), part_bytes
        self.stats = RelayStats()
        self.manifest_from = ""
        """Where the manifest came from: "given", "parent" or "fallback" ("": not yet)."""
        self._on_event = on_event or (lambda event: None)
        self._manifest_fallback, self._held = manifest_fallback, held
        self._manifest_json: bytes | None = None  # its canonical JSON, as sent to children that ask
        self._abandoned: str | None = None  # why this relay will never have its manifest (children waiting are told)
        self._book: ChunkBook | None = None
        self._sessions: dict[int, Session] = {}
        self._waiters = Waiters()  # children held until their assignment arrives
        self._assigned: dict[int, set[str]] | None = None  # child -> sha256 of credentials the site issued it
        self._parent: tuple[str, int] | None = None
        self._parent_changed = asyncio.Event()
        self._complete = asyncio.Event()
        if manifest is not None:
            self._take_manifest(manifest, "given", chunks)

    def _take_manifest(self, manifest: Manifest, source: str, chunks: Mapping[int, bytes] | None = None) -> None:
        """From now on the relay knows its manifest (verified by whoever gives it): the chunks it holds of it are
        stored and children waiting for it are sent their ``accept``."""
        if (manifest.job_id, manifest.version) != (self.job_id, self.version):  # the site's slip, not a peer's
            raise SnapshotError(f"worker {self.worker_id}: a manifest of job {manifest.job_id} version "
                                f"{manifest.version} for job {self.job_id} version {self.version}")
        if chunks is None and self._held is not None:
            chunks = self._held(manifest)  # (may refuse the manifest: SnapshotError, the relay keeps none)
        self.manifest, self.manifest_from, self._book = manifest, source, ChunkBook(manifest)
        for index, data in (chunks or {}).items():
            verify_chunk(manifest, index, data)
            self._store(index, data, quiet=True)
        if source != "given":
            self._emit("manifest", source=source)
        self._wake_sessions()
        self._waiters.notify()

    def manifest_json(self) -> bytes:
        """The manifest's canonical JSON, the bytes its reference hashes (built once, for every child that asks)."""
        if self._manifest_json is None:
            self._manifest_json = canonical_manifest(self.manifest)
        return self._manifest_json

    def abandon(self, reason: str) -> None:
        """This relay will not get its manifest (its agent gave up the version): children waiting for it are
        refused with ``reason`` rather than held until they give up."""
        self._abandoned = reason
        self._wake_sessions()

    # ---- state ---------------------------------------------------------------------------------

    @property
    def _chunks(self) -> dict[int, bytes]:
        """The verified chunks (none before the manifest is known)."""
        return self._book.done if self._book is not None else {}

    @property
    def complete(self) -> bool:
        return self._complete.is_set()

    @property
    def serving(self) -> bool:
        """Whether a child's session is open."""
        return bool(self._sessions)

    @property
    def have(self) -> list[int]:
        return sorted(self._chunks)

    def payload(self) -> bytes:
        return assemble(self.manifest, self._chunks)

    def ordered(self) -> list[bytes]:
        """The chunks in order, the whole checked against the manifest's digest (no joined copy)."""
        return ordered_chunks(self.manifest, self._chunks, digest=self._book.digest())

    def _store(self, index: int, data: bytes, *, source: str = "", quiet: bool = False) -> None:
        """Chunk ``index`` verified: installable, counted, and its last part may go to the children."""
        self._book.verified(index, data)
        self._wake_sessions()
        if not quiet:
            self._emit("chunk", index=index, source=source, have=len(self._chunks))
        if len(self._chunks) == len(self.manifest.chunks):
            self._complete.set()

    def _wake_sessions(self) -> None:
        for session in self._sessions.values():
            session.wake.set()

    def _emit(self, event: str, **fields: Any) -> None:
        self._on_event({"event": event, "worker_id": self.worker_id, "job_id": self.job_id,
                        "version": self.version, "t": time.time(), **fields})

    # ---- control (called by the agent when the site says so) -----------------------------------

    def set_parent(self, host: str | None, port: int | None = None, *, credential: str | None = None) -> None:
        """Pull from ``host:port`` from now on (``None``: no parent, fallback only); resumes where it is.

        ``credential`` is the one the site sent with this assignment. It replaces ours for the parent link only
        when the parent changes: an unchanged parent was told the fingerprint of the credential we had."""
        new = (host, int(port)) if host is not None and port is not None else None
        if credential:
            self.fallback_credential = credential
            if new != self._parent or self.credential is None:
                self.credential = credential
        if new != self._parent:
            if self._parent is not None:
                self.stats.parent_switches += 1
            self._parent = new
            self._parent_changed.set()
            self._emit("parent", parent=f"{host}:{port}" if new else None)

    def assign_children(self, children: Mapping[int, str | None] | Iterable[int] | None) -> None:
        """Only these workers may pull (``None``: anyone the secret admits, up to ``max_children``); others are
        dropped. A mapping gives the sha256 of the credential the site issued each child; a child assigned again
        keeps the fingerprints it had (it may still hold the earlier credential), a child left out loses them."""
        if children is None:
            self._assigned = None
        else:
            given = children if isinstance(children, Mapping) else dict.fromkeys(children)
            old = self._assigned or {}
            self._assigned = {int(c): old.get(int(c), set()) | ({fp} if fp else set()) for c, fp in given.items()}
        for worker_id, session in list(self._sessions.items()):
            if self._assigned is not None and worker_id not in self._assigned:
                session.writer.close()
        self._waiters.notify()

    # ---- child side ----------------------------------------------------------------------------

    async def receive(self) -> bytes:
        """Pull until every chunk verified; return the payload. Raises :class:`TransferError` when stuck."""
        return b"".join(await self.receive_chunks())

    async def receive_chunks(self) -> list[bytes]:
        """:meth:`receive`, returning the verified chunks in order rather than one joined payload."""
        try:
            return await self._receive_chunks()
        except BaseException as err:
            if self.manifest is None:  # children waiting for it would wait for nothing
                self.abandon(f"worker {self.worker_id} gave up job {self.job_id} version {self.version}: "
                             f"{err or type(err).__name__}")
            raise

    async def _receive_chunks(self) -> list[bytes]:
        hand_over_gil_often()  # a tail has no hub, and its loop must not queue behind the generation thread either
        failures, last_progress = 0, time.monotonic()
        while not self.complete:
            held, had_manifest = len(self._chunks), self.manifest
            parent = self._parent
            self._parent_changed.clear()
            if parent is None or (failures >= self.timeouts.parent_retries and self.fallback_url):
                if self.fallback_url:
                    await self._fallback_until_rerouted()
                    if self._parent != parent:
                        failures = 0
                    continue
                await self._wait_parent_change(1.0)
            else:
                pull = asyncio.create_task(self._pull(parent))
                switch = asyncio.create_task(self._parent_changed.wait())
                done, _ = await asyncio.wait({pull, switch}, return_when=asyncio.FIRST_COMPLETED)
                switch.cancel()
                if pull not in done:
                    pull.cancel()
                    with contextlib.suppress(asyncio.CancelledError, TransferError):
                        await pull
                elif pull.exception() is not None:
                    err = pull.exception()
                    if not isinstance(err, TransferError):
                        raise err
                    failures += 1
                    if isinstance(err, (PeerStalled, ManifestRefused)):  # frozen, or lying: no point knocking again
                        failures = max(failures, self.timeouts.parent_retries)
                    self.stats.parent_failures += 1
                    self._emit("parent_failed", parent=f"{parent[0]}:{parent[1]}", reason=str(err), failures=failures)
                    await self._wait_parent_change(min(2.0, 0.2 * failures))
                if self._parent != parent:
                    failures = 0
            if len(self._chunks) > held or (had_manifest is None and self.manifest is not None):
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > self.timeouts.give_up:
                where = f"{self._parent[0]}:{self._parent[1]}" if self._parent else "no parent"
                have = f"{len(self._chunks)}/{len(self.manifest.chunks)} chunks" if self.manifest else "no manifest"
                raise TransferError(f"worker {self.worker_id}: no progress for {self.timeouts.give_up:g} s "
                                    f"({have}, parent {where})")
        return self.ordered()

    async def _wait_parent_change(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._parent_changed.wait(), seconds)

    async def _pull(self, parent: tuple[str, int]) -> None:
        peer = f"parent {parent[0]}:{parent[1]}"
        reader, writer = await framing.open_peer(*parent, timeout=self.timeouts.connect)
        try:
            partial = self._book.partial() if self._book is not None else {}
            await self._handshake(reader, writer, partial, peer)
            if self.complete:  # the manifest named chunks this relay held already (a cached base)
                with contextlib.suppress(TransferError):
                    await framing.write_frame(writer, framing.bye(), peer=peer, timeout=self.timeouts.connect)
                return
            self.stats.resumed_with = len(self._chunks)
            self.stats.resumed_bytes += sum(partial.values())
            self._emit("accepted", parent=peer, resumed_with=len(self._chunks), resumed_bytes=sum(partial.values()))
            bad: Counter[int] = Counter()
            while not self.complete:
                frame = await framing.read_frame(reader, peer=peer, timeout=self.timeouts.stall,
                                                 downlink=self.downlink, max_payload=self._declared_size)
                if frame.type == "refuse":
                    raise PeerRefused(peer, frame.header["reason"])
                if frame.type == "idle":
                    continue
                await self._check_assignment(writer, frame, peer)
                index = frame.header["index"]
                if index in self._chunks:
                    continue
                try:  # verified (and stored by _store, below) or discarded before any await
                    data = self._book.add_part(index, frame.header.get("offset", 0), frame.payload, peer=peer)
                except SnapshotError as err:
                    if index in partial:  # its first bytes came from an earlier parent: not this one's fault
                        del partial[index]
                        self._emit("bad_chunk", index=index, parent="an earlier parent", reason=str(err), copies=0)
                        await framing.write_frame(writer, framing.want([index]), peer=peer, timeout=self.timeouts.stall)
                        continue
                    await self._bad_chunk(writer, index, bad, str(err), peer)
                    continue
                if data is None:  # a part: forwarded to our child, not verified yet
                    self._wake_sessions()
                    continue
                self.stats.from_parent += 1
                self._store(index, data, source="parent")
            with contextlib.suppress(TransferError):
                await framing.write_frame(writer, framing.bye(), peer=peer, timeout=self.timeouts.connect)
        finally:
            writer.close()

    async def _handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, partial: dict[int, int],
                         peer: str) -> None:
        """Our ``hello`` (asking for the manifest when we have none), the parent's ``accept`` (and the manifest in
        it, verified); TransferError when the parent refuses, lies or stalls."""
        ask = self.manifest is None
        await framing.write_frame(writer, framing.hello(job_id=self.job_id, version=self.version,
                                                        worker_id=self.worker_id, have=self.have,
                                                        credential=self.credential, partial=partial, manifest=ask),
                                   peer=peer, timeout=self.timeouts.stall)
        # The parent may hold us until the site's word reaches it (assign_wait), then while it waits for its own
        # manifest it says so (idle) every KEEPALIVE_S: silence for ``stall`` is a frozen parent.
        limit = self.reference.size + MANIFEST_SLACK_BYTES if ask else 0
        frame = await framing.read_frame(reader, peer=peer, max_payload=limit, downlink=self.downlink,
                                         timeout=self.timeouts.assign_wait + self.timeouts.stall)
        while frame.type == "idle":
            frame = await framing.read_frame(reader, peer=peer, max_payload=limit, downlink=self.downlink,
                                             timeout=self.timeouts.stall)
        if frame.type == "refuse":
            raise PeerRefused(peer, frame.header["reason"])
        await self._check_assignment(writer, frame, peer)
        if ask and self.manifest is None:
            if frame.payload:
                await self._manifest_from_parent(writer, frame.payload, peer)
            else:  # a parent that sends none: our own fetch (not the parent's fault)
                await self._manifest_from_fallback()

    async def _manifest_from_parent(self, writer: asyncio.StreamWriter, payload: bytes, peer: str) -> None:
        """Take the manifest in the parent's ``accept`` only if it hashes to the reference the site announced; else
        refuse the parent (ManifestRefused: reported, not knocked on again; the fallback gives the manifest)."""
        try:  # in a thread: a manifest may be megabytes of JSON
            manifest = await asyncio.to_thread(verified_manifest, payload, self.reference,
                                               what=f"the manifest from {peer}")
        except SnapshotError as err:
            self.stats.manifests_refused += 1
            await framing.refuse_and_close(writer, "refused: a manifest other than the one the site announced",
                                           peer=peer, timeout=self.timeouts.connect)
            raise ManifestRefused(str(err)[:500]) from None
        if self.manifest is None:  # (the fallback may have given it meanwhile)
            self._take_manifest(manifest, "parent")
            if is_canonical(payload, self.reference):  # what our own child asks for: no second serialization
                self._manifest_json = payload

    async def _bad_chunk(self, writer: asyncio.StreamWriter, index: int, bad: Counter[int], reason: str,
                         peer: str) -> None:
        """Chunk ``index`` from the parent failed its sha256: ask again, or after too many bad copies take it from
        the fallback (none: give up on this parent)."""
        bad[index] += 1
        self.stats.bad_chunks += 1
        self._emit("bad_chunk", index=index, parent=peer, reason=reason, copies=bad[index])
        if bad[index] <= self.timeouts.bad_chunk_retries:
            await framing.write_frame(writer, framing.want([index]), peer=peer, timeout=self.timeouts.stall)
        elif self.fallback_url:
            await self._fetch_fallback([index])
        else:
            raise TransferError(f"{peer} sent chunk {index} with a bad sha256 {bad[index]} times")

    def _declared_size(self, header: dict[str, Any]) -> int:
        """The most payload a parent's frame may carry: what is left of the chunk it names after its offset, by the
        manifest (a frame declaring more is refused before a byte of it is read), nothing for any other frame."""
        index = header.get("index", -1) if header["type"] == "chunk" else -1
        if self.manifest is None or not 0 <= index < len(self.manifest.chunks):
            return 0
        return max(0, self.manifest.chunks[index].size - header.get("offset", 0))

    async def _check_assignment(self, writer: asyncio.StreamWriter, frame: Frame, peer: str) -> None:
        """Accept only ``accept``/``chunk`` frames for our own job and version; refuse and close otherwise."""
        h = frame.header
        reason = None
        if frame.type not in ("accept", "chunk"):
            reason = f"unexpected {frame.type} frame"
        elif (h["job_id"], h["version"]) != (self.job_id, self.version):
            reason = (f"worker {self.worker_id} was assigned job {self.job_id} version {self.version}, "
                      f"not job {h['job_id']} version {h['version']}")
        if reason:
            await framing.refuse_and_close(writer, reason, peer=peer, timeout=self.timeouts.connect)
            raise TransferError(f"{peer}: refused: {reason}")
