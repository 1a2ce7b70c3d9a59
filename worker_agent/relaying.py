"""The agent's side of the forwarding chains (paper section 4.2): the relay hub it listens on, a relay per version
it receives and serves, its place in the chain (parent, child) as the site routes it, and relay failures reported.

A version comes from the chain parent (each chunk forwarded to our child as soon as we have it); what the parent
cannot give comes over HTTP from the learner (the fallback). So does its manifest: the parent's ``accept`` carries
it, checked against the reference the site sent; a parent that fails or sends another is reported and the
manifest is fetched from the learner instead. Our relay serves a child only with the credential the site gave
that child (its sha256 comes with the route), whatever id a peer claims (docs/trust.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping

import websockets

from dataplane import messages as m
from dataplane.broadcast.hub import RelayHub
from dataplane.broadcast.ratelimit import bucket
from dataplane.broadcast.relay import RelayTimeouts, SnapshotRelay
from dataplane.snapshot import Manifest, ManifestReference

log = logging.getLogger("echo2.agent")


class Relays:
    """The relays of the versions this agent receives and serves, keyed by (job, version)."""

    def __init__(self, *, worker_id: int, bandwidth_bps: float | None, listen: str | None,
                 report: Callable[[m._Msg], Awaitable[None]]) -> None:
        """``listen``: "host:port" of the hub our children dial (None: no hub); ``report`` sends a message to the
        site (a relay failure)."""
        self.worker_id = worker_id
        self.bandwidth_bps = bandwidth_bps
        self.listen = listen
        self.report = report
        self.hub: RelayHub | None = None
        self.port: int | None = None  # the hub's, once listening
        self.relays: dict[tuple[int, int], SnapshotRelay] = {}
        self.parents: dict[tuple[int, int], int | None] = {}
        self.reported_failures: set[tuple[int, int, str]] = set()

    def __contains__(self, key: tuple[int, int]) -> bool:
        return key in self.relays

    def get(self, key: tuple[int, int]) -> SnapshotRelay | None:
        return self.relays.get(key)

    async def start_hub(self) -> None:
        if self.hub is None and self.listen:
            host, _, port = self.listen.rpartition(":")
            hub = RelayHub()
            self.port = await hub.start(host, int(port))
            self.hub = hub
            log.info("relay listening on %s", self.listen)

    async def close(self) -> None:
        """Stop listening (the agent is shutting down)."""
        if self.hub is not None:
            await self.hub.close()
            self.hub = None

    async def receive(self, snap: m.SnapshotAvailable, manifest: Manifest | None, *,
                      manifest_fallback: Callable[[], Awaitable[Manifest]] | None = None,
                      held: Callable[[Manifest], Mapping[int, bytes] | None] | None = None,
                      timeouts: RelayTimeouts | None = None) -> tuple[Manifest, list[bytes], str]:
        """Pull ``snap``'s version from the chain parent (forwarding to our child as chunks arrive); the relay fetches
        what its parent cannot give from the learner's HTTP server. ``manifest``: the version's, if the agent holds it
        already; else it comes in the parent's ``accept``, verified against ``snap``'s reference, or, when the parent
        fails or lies, from ``manifest_fallback`` (the agent's own fetch from the learner). ``held``: the chunks the
        agent holds once the manifest is known (a cached base: this relay is then an origin for our child; it may
        refuse the manifest); ``timeouts``: the relay's waits (worker_agent.timing.relay_timeouts: from the measured
        round trips). Returns (manifest, the verified chunks in order, source)."""
        await self.start_hub()
        bw = self.bandwidth_bps
        relay = SnapshotRelay(manifest, worker_id=self.worker_id, fallback_url=snap.url, held=held,
                              reference=ManifestReference(snap.manifest_sha256, snap.manifest_bytes),
                              job_id=snap.job_id, version=snap.version, manifest_fallback=manifest_fallback,
                              uplink=bucket(bw), downlink=bucket(bw), on_event=self._event,
                              credential=snap.credential,  # shown to the parent, the hub and the HTTP fallback
                              timeouts=timeouts)
        key = (snap.job_id, snap.version)
        self.relays[key] = relay
        if self.hub is not None:
            self.hub.register(relay)
        self.reroute(relay, snap)
        ordered = await relay.receive_chunks()
        stats = relay.stats
        source = "parent" if stats.from_parent and stats.from_parent >= stats.from_fallback else "fallback"
        log.debug("snapshot v%d of job %d: %d chunks from parent, %d from fallback, manifest from %s", snap.version,
                  snap.job_id, stats.from_parent, stats.from_fallback, relay.manifest_from)
        return relay.manifest, ordered, source

    def reroute(self, relay: SnapshotRelay | None, snap: m.SnapshotAvailable) -> None:
        """Our place in the chain for ``snap``'s version, as the site routes it now (a publication or a repair)."""
        key = (snap.job_id, snap.version)
        if relay is None:  # dropped meanwhile
            return
        self.parents[key] = snap.parent_worker_id
        relay.assign_children({c: snap.child_credential_sha256.get(c) for c in snap.children})
        if snap.parent and not relay.complete:
            host, _, port = snap.parent.rpartition(":")
            relay.set_parent(host, int(port), credential=snap.credential)
            log.debug("snapshot v%d of job %d: pulling from %s (%s), serving %s", snap.version, snap.job_id,
                     snap.parent, f"worker {snap.parent_worker_id}" if snap.parent_worker_id else "learner",
                     snap.children or "no child")

    def _event(self, event: dict) -> None:
        """A relay's event: a parent that failed is reported to the site once per (version, parent)."""
        if event["event"] != "parent_failed":
            return
        key = (event["job_id"], event["version"])
        marker = (*key, event.get("parent", ""))
        if marker in self.reported_failures:
            return
        self.reported_failures.add(marker)
        message = m.RelayFailed(job_id=key[0], version=key[1], culprit_worker_id=self.parents.get(key),
                                reason=str(event.get("reason", ""))[:500])

        async def report() -> None:
            with contextlib.suppress(ConnectionError, websockets.WebSocketException):
                await self.report(message)

        asyncio.get_running_loop().create_task(report())

    def retire(self, job_id: int, *, keep_from: int) -> None:
        """Stop serving versions older than ``keep_from`` (our child has had time to take the newer one)."""
        for key in [k for k in self.relays if k[0] == job_id and k[1] < keep_from]:
            self.drop(key)

    def drop_other_jobs(self, job_id: int) -> None:
        for key in [k for k in self.relays if k[0] != job_id]:
            self.drop(key)

    def drop(self, key: tuple[int, int]) -> None:
        relay = self.relays.pop(key, None)
        if relay is not None:  # a child still waiting for its manifest is told now, not after its give_up
            relay.abandon(f"worker {self.worker_id} no longer relays job {key[0]} version {key[1]}")
        self.parents.pop(key, None)
        if self.hub is not None:
            self.hub.unregister(*key)
