"""How the agent installs its job's snapshots (an object of :class:`~worker_agent.session.AgentSession`).

The engine belongs to one job (:class:`JobEngine`): it is built for that job from the job's base snapshot,
version 0 (:mod:`dataplane.basemodel`), checked against the job's base digest and kept in the agent's
:class:`~worker_agent.cache.BaseCache`, through the same ``from_pretrained`` path as any checkpoint directory;
then each later version's weights are loaded into it. Every version, the base included, arrives the same way:
from the chain parent (the session's relay, forwarding to our child: the manifest in the parent's ``accept``, then
the chunks) or over HTTP (the manifest fetched once from the learner, then the chunks), the manifest used only when
it hashes to the reference the site sent (:class:`~worker_agent.manifests.Manifests`), every chunk verified
against it.
A version published as a delta is applied to the full payload of its base version, which the engine's
:class:`~worker_agent.weights.HeldWeights` keep (waiting for that version's install when it is still under way);
without it the version's full payload comes over HTTP from the learner's store, and an agent with no chain child
to forward the delta to does not even fetch the delta (docs/broadcast.md "Deltas on the wire, fulls from the
cache"). A failed install leaves the old weights and marks the version as one to reach before generating again.
Where nothing is forwarded, one version of a job is fetched at a time (:meth:`Installer.offer`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import websockets

from dataplane import basemodel
from dataplane import messages as m
from dataplane.snapshot import Manifest, SnapshotError, fetch_chunks, full_url, split

from .cache import BaseCache
from .engines.base import Engine
from .manifests import Manifests
from .relaying import Relays
from .taskdata import fetch_task_data
from .timing import TRANSFER_FACTOR, Rates, RoundTrips, fetch_timeouts, relay_timeouts, transfer_timeout
from .weights import HeldWeights, rebuild

log = logging.getLogger("echo2.agent")

ENGINE_WAIT_S = 600.0  # a version downloaded while the job's base is still being installed waits this long for it


def check_base(manifest: Manifest, expected: str | None) -> None:
    """Refuse a version-0 manifest that is no base archive, or not of the job's base digest."""
    if manifest.format != basemodel.FORMAT:
        raise SnapshotError(f"version 0 is a {manifest.format!r} payload, not a base checkpoint archive")
    if expected and manifest.sha256 != expected:
        raise SnapshotError(f"base snapshot sha256 {manifest.sha256[:12]}... is not the job's base digest "
                            f"{expected[:12]}...")


@dataclass
class JobEngine:
    """The engine of the one job the agent serves: built from that job's base snapshot (``base_digest``), then
    updated by the job's snapshots; ``version`` is the snapshot whose weights it holds (0: the base)."""

    job_id: int
    base_digest: str
    engine: Engine
    version: int = 0
    held: HeldWeights | None = None  # the full payload of ``version`` (None for the base): what deltas apply to


class Installer:
    """The job's engine and its versions: what is installed, what is being installed, what must be reached before
    generating. ``assignment()`` is the agent's current assignment (None: no job); ``send`` reports installs to the
    site; ``relays`` receive and serve the versions that come down a chain."""

    def __init__(self, *, cache: BaseCache, engine_factory: Callable[[str], Engine], relays: Relays,
                 send: Callable[[m._Msg], Awaitable[None]], assignment: Callable[[], m.Assign | None],
                 round_trips: RoundTrips | None = None, rates: Rates | None = None,
                 user_code: Callable[[], bool] = lambda: False) -> None:
        self.cache = cache
        self.user_code = user_code  # the provider's opt-in to job owners' code: only then is a code package fetched
        self.round_trips, self.rates = round_trips or RoundTrips(), rates or Rates()  # time the HTTP fetches
        self.manifests = Manifests()  # each version's manifest, fetched once
        self.engine_factory = engine_factory
        self.relays = relays
        self.send = send
        self._assignment = assignment
        self.job: JobEngine | None = None
        self.wanted: dict[int, int] = {}  # job id -> version to reach before generating (told when joining, or failed)
        self.installing: dict[tuple[int, int], asyncio.Task] = {}  # (job, version) -> its install, running
        self.install_lock = asyncio.Lock()  # held while generating: no install lands in the middle of a batch
        self.joined_at: dict[int, float] = {}  # job id -> when this agent started serving it (time.time())
        # the last install, for the status line: (job, version, seconds, since what: publication or joining the job)
        self.last_install: tuple[int, int, float, str] | None = None
        self.held: dict[int, m.SnapshotAvailable] = {}  # job id -> the newest version waiting for a fetch to end
        self.superseded = 0  # versions never fetched: a newer one came while they waited

    @property
    def assignment(self) -> m.Assign | None:
        return self._assignment()

    async def join(self, assign: m.Assign) -> None:
        """Start serving ``assign``'s job: another job's engine (or one of another base) is dropped, never reused;
        the job's base is installed when the assignment names it, and the newest version it names is to be
        reached before generating (asked for afresh once the base is in: it may be gone by then)."""
        self.joined_at[assign.job_id] = time.time()
        job = self.engine_for(assign.job_id)
        if self.job is not None and (job is None or assign.base_digest not in (None, job.base_digest)):
            log.info("job %d: dropping the engine of job %d; this job starts from its own base", assign.job_id,
                     self.job.job_id)
            async with self.install_lock:
                self.job = None
        for key, task in list(self.installing.items()):
            if key[0] != assign.job_id:
                task.cancel()
        self.relays.drop_other_jobs(assign.job_id)
        if assign.snapshot:
            self.want(assign.job_id, int(assign.snapshot["version"]))
        if assign.base and self.engine_for(assign.job_id) is None:
            self.install(m.SnapshotAvailable.model_validate(assign.base))

    def want(self, job_id: int, version: int) -> None:
        """Generate for ``job_id`` again only once ``version`` (or a newer one) is installed."""
        self.wanted[job_id] = max(self.wanted.get(job_id, 0), version)

    def engine_for(self, job_id: int | None) -> JobEngine | None:
        """The engine of job ``job_id``, if the agent holds one (built from that job's base)."""
        return self.job if self.job is not None and self.job.job_id == job_id else None

    def installed_version(self, job_id: int | None) -> int | None:
        job = self.engine_for(job_id)
        return job.version if job else None

    def ready(self, job_id: int) -> bool:
        """The job's base is installed, and at least the version the agent must reach before generating."""
        job = self.engine_for(job_id)
        return job is not None and job.version >= self.wanted.get(job_id, 0)

    def activity(self, job_id: int | None) -> tuple[bool, bool]:
        """What the installer does for ``job_id`` now: (loading: building the engine from the base, installing: a
        later version going into a built engine), as the heartbeat's state reports it (:mod:`worker_agent.state`)."""
        built = self.engine_for(job_id) is not None
        ours = [version for key_job, version in self.installing if key_job == job_id]
        return bool(ours) and (not built or 0 in ours), built and any(version > 0 for version in ours)

    def offer(self, snap: m.SnapshotAvailable) -> None:
        """Install ``snap``, unless another version of its job is still being fetched and this agent forwards this
        one to no chain child: then it is held until that fetch ends, and a newer version replaces it (superseded,
        never fetched). Started together, versions share the agent's downlink: on a slow link (10 Mbit/s, a 16 MB
        snapshot every 3 s) none finished before the next ones started, and the agent installed nothing for
        minutes (docs/agent.md "Timing on long links"). A version with a child to serve, the base, a repair of a
        version already relayed, and any version while nothing is fetched go at once."""
        job, key = snap.job_id, (snap.job_id, snap.version)
        busy = [task for (j, v), task in self.installing.items() if j == job and v != snap.version]
        held = self.held.get(job)
        if snap.version == 0 or snap.children or key in self.relays or not busy:
            if held is not None and held.version <= snap.version:
                self.held.pop(job)  # this one is as new or newer: the held one is superseded
                self.superseded += held.version < snap.version
            self.install(snap)
        elif held is not None and held.version > snap.version:
            self.superseded += 1  # older than the one already waiting: never fetched
        else:
            self.superseded += held is not None and held.version < snap.version
            self.held[job] = snap  # (the same version again, a reroute, replaces its copy)
            log.debug("job %d: v%d waits until the fetch in flight ends (it has no child to serve)", job, snap.version)
        if job in self.held:  # whichever fetch of the job ends next lets it go (or holds it again)
            for (j, v), task in self.installing.items():
                if j == job and v != self.held[job].version:
                    task.add_done_callback(lambda _, job=job: self._fetch_ended(job))

    def _fetch_ended(self, job: int) -> None:
        """A fetch of ``job`` ended (installed or failed): the held version goes now, if the agent still serves
        the job and the version is newer than what the engine holds."""
        snap = self.held.get(job)
        if snap is None or any(j == job and v != snap.version for (j, v) in self.installing):
            return  # nothing held, or still another fetch in flight (its own callback comes)
        self.held.pop(job)
        if self.assignment is not None and self.assignment.job_id == job:
            self.install(snap)

    def install(self, snap: m.SnapshotAvailable) -> None:
        """Install ``snap`` in the background (a reconnect does not restart a download), unless it is relayed
        already, being installed, or not wanted."""
        key = (snap.job_id, snap.version)
        if key in self.relays:  # a repair: new parent and/or child for a version we already relay
            if snap.parent:  # (an answer to our snapshot_request carries no route: the relay keeps its own)
                self.relays.reroute(self.relays.get(key), snap)
            return
        if key in self.installing or not self._wants(snap):
            return
        task = self.installing[key] = asyncio.create_task(self._run_install(snap, key))
        task.add_done_callback(lambda done: self.installing.pop(key) if self.installing.get(key) is done else None)

    async def _run_install(self, snap: m.SnapshotAvailable, key: tuple[int, int]) -> None:
        try:
            if snap.version == 0:
                await self._install_base(snap)
            else:
                await self._install_weights(snap)
        except asyncio.CancelledError:  # the agent left the job
            self.relays.drop(key)
            raise
        except Exception as err:  # the old weights stay; no generation until a version this new is installed
            log.error("snapshot %s of job %s: install failed: %s", snap.version, snap.job_id, err)
            self.want(snap.job_id, snap.version)
            self.relays.drop(key)

    def _wants(self, snap: m.SnapshotAvailable) -> bool:
        if self.assignment is None or self.assignment.job_id != snap.job_id:
            return False
        job = self.engine_for(snap.job_id)
        if snap.version == 0:
            return job is None
        return job is None or snap.version > job.version  # before the base is in: fetched, installed after it

    async def _install_base(self, snap: m.SnapshotAvailable) -> None:
        """Build the job's engine from its base snapshot: from the cache when it holds the job's base digest (no
        manifest needed, unless a chain child is to be served from it), else downloaded (relay or HTTP, every chunk
        verified) and unpacked into the cache."""
        expected = self.assignment.base_digest if self.assignment else None
        path = await asyncio.to_thread(self.cache.get, expected) if expected and not snap.parent else None
        digest, source = expected, "cache"
        if path is None and snap.parent:
            path, digest, source = await self._relayed_base(snap, expected)
        elif path is None:
            manifest = await self._manifest(snap)
            check_base(manifest, expected)
            path, source = await self._base_directory(snap, manifest)
            digest = manifest.sha256
        if self.assignment is not None and self.assignment.job_id == snap.job_id:  # the job's data sets, if any
            await asyncio.to_thread(fetch_task_data, self.cache, self.assignment.task, snapshot_url=snap.url,
                                    credential=snap.credential, allow_user_code=self.user_code())
        log.info("job %d: building the engine from base snapshot %s... (%s)", snap.job_id, digest[:12], path)
        engine = await asyncio.to_thread(self.engine_factory, str(path))
        async with self.install_lock:
            if not self._wants(snap):  # reassigned meanwhile
                return
            engine.prompt_format = self.assignment.prompt_format  # the job's, for every prompt it encodes
            self.job = JobEngine(job_id=snap.job_id, base_digest=digest, engine=engine)
        await self._report_installed(snap, source)

    async def _base_directory(self, snap: m.SnapshotAvailable, manifest: Manifest) -> tuple[Path, str]:
        """The checkpoint directory of the base digest over HTTP (no chain parent), and where it came from."""
        digest = manifest.sha256
        path = await asyncio.to_thread(self.cache.get, digest)  # (the assignment named no digest to look for)
        if path is not None:
            return path, "cache"
        chunks = await self._fetch(snap.url, manifest, snap.credential)
        return await asyncio.to_thread(self.cache.put, digest, b"".join(chunks)), "http"

    async def _relayed_base(self, snap: m.SnapshotAvailable, expected: str | None) -> tuple[Path, str, str]:
        """The base through the relay (its directory, digest and source), even when cached, so the chain child is
        served: from the cache's copy, cut as the manifest says once it came (from the parent or the fallback)."""
        cached = await asyncio.to_thread(self.cache.payload, expected) if expected else None

        def held(manifest: Manifest) -> dict[int, bytes] | None:
            check_base(manifest, expected)  # refused before a chunk of another payload is taken or served
            return dict(enumerate(split(cached, manifest.chunk_bytes))) if cached else None

        manifest, chunks, source = await self._relayed(snap, held=held)
        path = await asyncio.to_thread(self.cache.put, manifest.sha256, b"".join(chunks))
        return path, manifest.sha256, "cache" if cached else source

    async def _relayed(self, snap: m.SnapshotAvailable, *,
                       held: Callable[[Manifest], dict[int, bytes] | None] | None = None,
                       ) -> tuple[Manifest, list[bytes], str]:
        """``snap``'s manifest and verified chunks from the chain parent (forwarding to our child), and their source.
        The manifest comes with the parent's ``accept`` unless held already; from the learner only when the parent
        fails or lies (:meth:`_manifest`)."""
        known = self.manifests.held(snap)
        manifest, chunks, source = await self.relays.receive(snap, known, held=held,
                                                             manifest_fallback=lambda: self._manifest(snap),
                                                             timeouts=relay_timeouts(self.round_trips))
        if known is None:
            relay = self.relays.get((snap.job_id, snap.version))
            if relay is not None and relay.manifest_from == "parent":
                self.manifests.relayed_by_parent(snap, manifest)
        return manifest, chunks, source

    async def _install_weights(self, snap: m.SnapshotAvailable) -> None:
        if snap.parent:
            manifest, chunks, source = await self._relayed(snap)
        else:
            manifest = await self._manifest(snap)
            if manifest.kind == "delta" and not self._base_within_reach(snap.job_id, manifest):
                chunks, source = None, "http"  # no child to forward the delta to, no base to apply it to: skip it
            else:
                chunks, source = await self._fetch(snap.url, manifest, snap.credential), "http"
        job = await self._engine_when_built(snap.job_id)
        if job is None or snap.version <= job.version:
            return
        held, source = await self._full_payload(snap, manifest, chunks, job, source)
        tensors, adapter = await asyncio.to_thread(lambda: (held.tensors(), held.adapter()))
        async with self.install_lock:
            if self.job is not job or snap.version <= job.version:
                return
            if adapter is not None:  # a LoRA job: the version's adapter applied on the installed base
                await asyncio.to_thread(job.engine.load_adapter, tensors, adapter, version=manifest.version)
            else:
                await asyncio.to_thread(job.engine.load_weights, tensors)
            job.version, job.held = manifest.version, held
        self.relays.retire(snap.job_id, keep_from=snap.version - 1)
        await self._report_installed(snap, source)

    def _base_within_reach(self, job_id: int, delta: Manifest) -> bool:
        """The engine holds the full payload of ``delta``'s base version, or that version's install is under way."""
        job = self.engine_for(job_id)
        held = job.held.version if job is not None and job.held is not None else None
        return held == delta.base_version or (job_id, delta.base_version) in self.installing

    async def _full_payload(self, snap: m.SnapshotAvailable, manifest: Manifest, chunks: list[bytes] | None,
                            job: JobEngine, source: str) -> tuple[HeldWeights, str]:
        """The full payload of ``snap``'s version: its chunks, or a delta applied to the held base (after the
        base's own install, if it is under way); failing that (or with no delta ``chunks``: the agent did not
        fetch a delta it could not apply), the full payload from the learner's store over HTTP (source ``http``).
        A delta is applied only to the base it names, and the result only kept when it hashes to the learner's
        digest of the version (:func:`~worker_agent.weights.rebuild`): never installed on other weights."""
        if manifest.kind == "full":
            return HeldWeights(manifest, chunks), source
        base_install = self.installing.get((snap.job_id, manifest.base_version))
        if chunks is not None and base_install is not None and base_install is not asyncio.current_task():
            await asyncio.wait([base_install])  # its failure is its own: then we fetch the full payload
        if chunks is not None and job.held is not None and job.held.version == manifest.base_version:
            try:
                return await asyncio.to_thread(rebuild, manifest, chunks, job.held), source
            except SnapshotError as err:
                log.warning("job %d: %s; fetching the full payload of v%d", snap.job_id, err, snap.version)
        else:
            log.debug("job %d: v%d is a delta against v%d, and the engine holds v%d: fetching its full payload",
                      snap.job_id, snap.version, manifest.base_version, job.version)
        full = await self._fetch(full_url(snap.url), manifest.full, snap.credential)
        return HeldWeights(manifest.full, full), "http"

    async def _manifest(self, snap: m.SnapshotAvailable) -> Manifest:
        """The manifest ``snap`` names by reference, held or fetched from the learner
        (:class:`~worker_agent.manifests.Manifests`), each try of its fetch within a transfer's wait for its size at
        the measured round trip and rate."""
        timeout = transfer_timeout(snap.manifest_bytes, rtt=self.round_trips.path_rtt, rate_bps=self.rates.rate)
        return await self.manifests.get(snap, timeout=timeout)

    async def _fetch(self, url: str, manifest: Manifest, credential: str | None) -> list[bytes]:
        """Every chunk over HTTP, within waits derived from the measured round trip and rate (worker_agent/timing.py):
        a read waits at most a chunk's transfer timeout, the whole at most the payload's; the rate it reached times
        the next fetch."""
        per_read, whole = fetch_timeouts([c.size for c in manifest.chunks], rtt=self.round_trips.path_rtt,
                                         rate_bps=self.rates.rate)
        began = time.monotonic()
        try:
            chunks = await asyncio.to_thread(fetch_chunks, url, manifest, timeout=per_read, credential=credential,
                                             deadline=began + whole)
        except SnapshotError as err:
            if time.monotonic() - began < whole:
                raise
            rate = self.rates.rate / 1e6
            raise SnapshotError(f"v{manifest.version} from {url}: timed out: {manifest.total_bytes} bytes not fetched "
                                f"within {whole:.0f} s ({TRANSFER_FACTOR:g} x their time at {rate:.2f} MB/s, the rate "
                                f"measured): {err}") from None
        self.rates.add(manifest.total_bytes, time.monotonic() - began)
        return chunks

    async def _engine_when_built(self, job_id: int) -> JobEngine | None:
        """The job's engine, waiting while its base is being installed; None once the agent left the job."""
        deadline = time.monotonic() + ENGINE_WAIT_S
        while self.engine_for(job_id) is None:
            if self.assignment is None or self.assignment.job_id != job_id:
                return None
            if time.monotonic() > deadline:
                raise SnapshotError(f"the job's base was not installed within {ENGINE_WAIT_S:g} s")
            await asyncio.sleep(0.2)
        return self.engine_for(job_id)

    async def _report_installed(self, snap: m.SnapshotAvailable, source: str) -> None:
        now = time.time()
        seconds = max(0.0, now - snap.published_at)  # to the site: publication to install (T_bcast)
        relay = self.relays.get((snap.job_id, snap.version))
        stats = relay.stats if relay else None
        # The provider is told the time since this agent could have started: a worker that joined after the
        # snapshot was published counts from joining (its base was published long before it came).
        joined = self.joined_at.get(snap.job_id, 0.0)
        since = "after joining the job" if joined > snap.published_at else "after publication"
        took = max(0.0, now - max(joined, snap.published_at))
        self.last_install = (snap.job_id, snap.version, took, since)
        # the base once per job at INFO; every later version is in the status line (DEBUG here)
        log.log(logging.INFO if snap.version == 0 else logging.DEBUG, "installed snapshot v%d of job %d (%.2fs %s, "
                "via %s)", snap.version, snap.job_id, took, since, source)
        with contextlib.suppress(ConnectionError, websockets.WebSocketException):  # reported again on reconnect
            await self.send(m.SnapshotInstalled(job_id=snap.job_id, version=snap.version, seconds=seconds,
                                                source=source, from_parent=stats.from_parent if stats else 0,
                                                from_fallback=stats.from_fallback if stats else 0))

