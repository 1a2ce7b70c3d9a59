"""The manifests of the versions the agent installs, had once each (docs/broadcast.md "The manifest by reference").

A ``snapshot`` message names its manifest by reference (``manifest_sha256``, ``manifest_bytes``). An agent with a
chain parent takes it from the parent's relay ``accept`` (:mod:`worker_agent.relaying`); one without, or whose
parent failed or lied, fetches ``{url}manifest.json`` from the learner's server with the worker's credential (the
one its chunks take). Either way it keeps it only if it hashes to the reference
(:func:`dataplane.snapshot.verified_manifest`), so it holds the manifest the site checked, never another. A manifest
is content-addressed by that reference: a repair, a re-sent assignment or the answer to a ``snapshot_request`` for a
version already held costs no second fetch, and installs in flight for the same version share one.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict

from dataplane import messages as m
from dataplane.snapshot import Manifest, ManifestReference, SnapshotError, fetch_manifest

RETRIES = 4  # after the first try: waits of about 0.5, 1, 2 and 4 s between them
BACKOFF_S = 0.5


def reference(snap: m.SnapshotAvailable) -> ManifestReference:
    return ManifestReference(snap.manifest_sha256, snap.manifest_bytes)


class Manifests:
    """The newest ``size`` manifests, by reference: fetched here, or given by a chain parent (the relay checked it
    against the same reference, :class:`~dataplane.broadcast.relay.SnapshotRelay`). ``fetched`` counts the fetches
    that ended with a verified manifest, ``relayed`` those that came from a parent instead (the tests read both)."""

    def __init__(self, *, size: int = 8) -> None:
        self.size = size
        self.fetched = 0
        self.relayed = 0
        self._held: OrderedDict[ManifestReference, Manifest] = OrderedDict()
        self._fetching: dict[ManifestReference, asyncio.Task] = {}

    def held(self, snap: m.SnapshotAvailable) -> Manifest | None:
        """``snap``'s manifest if it is held (no fetch)."""
        return self._held.get(reference(snap))

    def relayed_by_parent(self, snap: m.SnapshotAvailable, manifest: Manifest) -> None:
        """Hold ``manifest``, which ``snap``'s chain parent gave and the relay verified against ``snap``'s
        reference: a repair or a re-sent assignment for the version costs no fetch either."""
        ref = reference(snap)
        if ref not in self._held:
            self.relayed += 1
            self._keep(ref, manifest)

    async def get(self, snap: m.SnapshotAvailable, *, timeout: float) -> Manifest:
        """``snap``'s manifest: held, or fetched from ``{snap.url}manifest.json``, each try within ``timeout`` (the
        caller's bound for a transfer of its size, worker_agent/timing.py) and tried again after a failed connection,
        a 5xx or a try that ran out of time; SnapshotError naming the URL and why when it cannot be had or is not
        the manifest the reference names."""
        ref = reference(snap)
        held = self._held.get(ref)
        if held is not None:
            self._held.move_to_end(ref)
            return held
        task = self._fetching.get(ref)
        if task is None or task.get_loop() is not asyncio.get_running_loop():
            # A task of its own: one install cancelled (the agent left the job) must not cancel another's wait.
            task = self._fetching[ref] = asyncio.get_running_loop().create_task(self._fetch(snap, ref, timeout))
        return await asyncio.shield(task)

    async def _fetch(self, snap: m.SnapshotAvailable, ref: ManifestReference, timeout: float) -> Manifest:
        deadline = time.monotonic() + (RETRIES + 1) * timeout + BACKOFF_S * 2**RETRIES  # every try and wait
        try:
            manifest = await asyncio.to_thread(fetch_manifest, snap.url, ref, timeout=timeout, retries=RETRIES,
                                               backoff_s=BACKOFF_S, credential=snap.credential, deadline=deadline)
        finally:
            self._fetching.pop(ref, None)
        if (manifest.job_id, manifest.version) != (snap.job_id, snap.version):  # the site's slip, not the server's
            raise SnapshotError(f"manifest from {snap.url}: of job {manifest.job_id} version {manifest.version}, "
                                f"not job {snap.job_id} version {snap.version}")
        self.fetched += 1
        self._keep(ref, manifest)
        return manifest

    def _keep(self, ref: ManifestReference, manifest: Manifest) -> None:
        self._held[ref] = manifest
        while len(self._held) > self.size:
            self._held.popitem(last=False)
