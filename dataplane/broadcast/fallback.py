"""The child side's HTTP fallback of a :class:`~dataplane.broadcast.relay.SnapshotRelay`: what its parent cannot give
(it failed ``parent_retries`` times, froze, lied, sent a chunk bad too often, or there is none) comes from the
learner's snapshot server, ``GET {url}chunks/{i}``, several requests in flight within the relay's downlink bucket,
until done or until the site routes the relay to a (new) parent (docs/broadcast.md "Relay"); so does the manifest
first, when the relay has only its reference (``GET {url}manifest.json``, or the agent's own bounded fetch). Mixed into
:class:`~dataplane.broadcast.relay.SnapshotRelay`, which holds the state named below; receiving from a parent stays
in :mod:`.relay`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from ..snapshot import Manifest, ManifestReference, SnapshotError, fetch_chunk, fetch_manifest
from .framing import TransferError
from .ratelimit import TokenBucket
from .relaystate import RelayStats, RelayTimeouts


class FallsBack:
    """What a relay takes from the fallback; mixed into :class:`~dataplane.broadcast.relay.SnapshotRelay`."""

    manifest: Manifest | None
    reference: ManifestReference | None
    worker_id: int
    job_id: int
    version: int
    fallback_url: str | None
    fallback_credential: str | None
    downlink: TokenBucket | None
    timeouts: RelayTimeouts
    stats: RelayStats
    _chunks: dict[int, bytes]
    _parent: tuple[str, int] | None
    _parent_changed: asyncio.Event
    _manifest_fallback: Callable[[], Awaitable[Manifest]] | None

    @property
    def complete(self) -> bool:
        raise NotImplementedError

    def _take_manifest(self, manifest: Manifest, source: str) -> None:
        raise NotImplementedError

    def _store(self, index: int, data: bytes, *, source: str = "", quiet: bool = False) -> None:
        raise NotImplementedError

    def _emit(self, event: str, **fields: Any) -> None:
        raise NotImplementedError

    async def _fallback_until_rerouted(self) -> None:
        """The fallback for every chunk still missing, until done or until the site routes us to a (new) parent: a
        chain repair that comes after the fallback started takes the rest from the relay it names, chunks already
        stored are kept, and the requests in flight are dropped (their threads finish into nothing). A chunk the
        fallback cannot give still raises :class:`TransferError`."""
        fetch = asyncio.create_task(self._fallback_all())
        switch = asyncio.create_task(self._parent_changed.wait())
        try:
            done, _ = await asyncio.wait({fetch, switch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            switch.cancel()
            if not fetch.done():
                fetch.cancel()
        if fetch in done:
            fetch.result()
            return
        with contextlib.suppress(asyncio.CancelledError, TransferError):
            await fetch
        self.stats.fallbacks_interrupted += 1
        self._emit("fallback_interrupted", parent=f"{self._parent[0]}:{self._parent[1]}" if self._parent else None,
                   held=len(self._chunks))

    async def _fallback_all(self) -> None:
        """Every chunk still missing from the fallback, the manifest first if the relay has none yet."""
        await self._manifest_from_fallback()
        if not self.complete:
            await self._fetch_fallback([c.index for c in self.manifest.chunks if c.index not in self._chunks])

    async def _manifest_from_fallback(self) -> None:
        """The manifest, when the relay has none and its parent gave none: from ``manifest_fallback`` (the agent's
        fetch, verified against the reference, bounded) or ``GET {fallback_url}manifest.json`` checked here. A
        manifest that cannot be had fails the transfer (SnapshotError, naming the URL and why)."""
        if self.manifest is not None:
            return
        if self._manifest_fallback is not None:
            manifest = await self._manifest_fallback()
        elif self.fallback_url:
            manifest = await asyncio.to_thread(fetch_manifest, self.fallback_url, self.reference,
                                               timeout=max(10.0, self.timeouts.stall),
                                               credential=self.fallback_credential)
        else:
            raise TransferError(f"worker {self.worker_id}: no manifest of job {self.job_id} version {self.version} "
                                "from the parent and no fallback to fetch it from")
        if self.manifest is None:  # (a parent may have given it meanwhile)
            self._take_manifest(manifest, "fallback")

    async def _fetch_fallback(self, indices: list[int]) -> None:
        """Fetch ``indices`` from the learner's HTTP server, up to ``timeouts.fallback_in_flight`` requests at once
        (one request per chunk; a long link needs several in flight to fill its bandwidth-delay product). A chunk's
        bytes are taken from the downlink bucket before its request goes out, so the requests in flight together
        stay within the bucket's rate. The first chunk that cannot be fetched raises :class:`TransferError` (the
        others still running are cancelled; chunks already stored are kept)."""
        base = self.fallback_url.rstrip("/") + "/"
        todo = [i for i in dict.fromkeys(indices) if i not in self._chunks]
        if not todo:
            return
        slots = asyncio.Semaphore(max(1, self.timeouts.fallback_in_flight))

        async def one(index: int) -> None:
            async with slots:
                if index in self._chunks:  # a parent (or a bad-chunk retry) got it meanwhile
                    return
                if self.downlink is not None:
                    await self.downlink.acquire(self.manifest.chunks[index].size)
                try:
                    data = await asyncio.to_thread(fetch_chunk, base, self.manifest, index,
                                                   timeout=self.timeouts.stall, credential=self.fallback_credential)
                except SnapshotError as err:
                    raise TransferError(f"fallback: {err}") from None
                if index not in self._chunks:
                    self.stats.from_fallback += 1
                    self._store(index, data, source="fallback")

        tasks = [asyncio.create_task(one(i)) for i in todo]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
