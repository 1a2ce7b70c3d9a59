"""The learner's publication policy: the :class:`Publisher` decides when and what to publish, and announces it.

What is published (each a version in the :class:`~learner.snapshots.SnapshotStore`, served by the HTTP server and
relay of :mod:`learner.serving`, announced to the site through the :class:`~learner.outbox.Outbox`):

- **the base**, version 0: the job's checkpoint directory, once per job, before any training (workers need no
  copy of their own, dataplane/basemodel.py); a restarted learner checks it is still the same files;
- **every kappa steps** the version just trained, written after its checkpoint (the checkpoint of a
  publication step is always committed first, learner/loop.py), on the committer's thread from the
  checkpoint's copy of the weights when there is one; **full or delta** as the store lays it out (after the
  first, a lossless delta against the version before, its full payload kept in the store for workers that lack
  the base; full when the delta does not pay, when the site has been down for ``MAX_UNANNOUNCED`` versions, or
  every ``snapshot_full_every`` versions when the job asks: learner/snapshots.py);
- **on resume** (a restart from the checkpoint): the checkpoint's version when the site lacks the last
  publication due by then (:func:`republish_on_resume`), else the site's newest announced again, at the new
  process's address;
- **the final model**, when the job completes between two publications (the owner exports the newest).

The version moves one way: the loop trains it, the Publisher writes it, serves it and hands it to the outbox,
which announces it to the site (now, or once the site answers again). The Publisher holds the newest version
it published (:attr:`Publisher.version`); the run reads it and ``publish_due`` raises, on the training thread, a
failure the committer's thread met (:class:`PublishError`). What the site answers (its number of chains) sets the
relay's fan-out here, inside the Publisher.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from dataplane.broadcast import strategies
from dataplane.jobs import JobSpec
from dataplane.snapshot import Manifest

from . import diskroom
from .client import SiteClient, SiteError
from .loop import LearnerLoop
from .outbox import Outbox, Publication
from .serving import LearnerRelay, SnapshotServer, manifest_json
from .settings import LearnerSettings
from .snapshots import SnapshotStore

log = logging.getLogger("echo2.learner")


class PublishError(Exception):
    """Publishing ``version`` failed (the site refused it); ``str(err)`` says why."""

    def __init__(self, version: int, reason: str) -> None:
        super().__init__(reason)
        self.version = version


def republish_on_resume(checkpoint_version: int, *, kappa: int, published_version: int) -> bool:
    """Whether a restarted learner at ``checkpoint_version`` publishes it at once: the site lacks the last
    publication due by then (the learner died before its outbox announced it). Otherwise the agents go on
    generating under an older version, and past S versions behind every record they return is dropped stale,
    so the learner never trains the step that would publish the next one."""
    return published_version < checkpoint_version - checkpoint_version % kappa


class Publisher:
    """Rank 0's publications (see the module): the store, its HTTP server and relay, and the outbox to the site.

    The training thread calls :meth:`publish_base` and, after a restart, :meth:`publish_resumed` before the first
    step; :meth:`publish_due` after every step; :meth:`publish_final` when the job completes. The outbox also
    carries the run's step reports (``outbox.report``): one queue to the site, in order."""

    def __init__(self, site: SiteClient, *, job_id: int, spec: JobSpec, loop: LearnerLoop, store: SnapshotStore,
                 server: SnapshotServer, relay: LearnerRelay | None) -> None:
        self.job_id, self.spec, self.loop = job_id, spec, loop
        self.store, self.server, self.relay = store, server, relay
        self.outbox = Outbox(site, job_id, on_published=self._announced)
        self.store.pinned = self.outbox.pending_versions  # a delta queued behind its base: both stay on disk
        self.version: int | None = None
        """The newest version published (written, served, handed to the outbox); None before the base."""
        self.seconds = 0.0  # the training thread's time in the last step's publication (the step's timing)
        self._failure: PublishError | None = None  # met by the committer's thread, raised by the next step
        self.room = diskroom.Backoff()  # publications skipped while the store's disk is full (learner/diskroom.py)
        loop.free_room = store.prune  # a checkpoint that finds the disk full drops what retention allows, too

    @classmethod
    @contextlib.contextmanager
    def opened(cls, site: SiteClient, settings: LearnerSettings, spec: JobSpec,
               loop: LearnerLoop) -> Iterator[Publisher]:
        """The job's store, its HTTP server and (chain broadcast) relay hub, refusing everyone until
        :meth:`set_secret`; stopped, with the outbox's thread, on exit."""
        job_id = settings.job
        with contextlib.ExitStack() as stack:
            store = SnapshotStore(settings.snapshot_dir / f"job{job_id}", job_id=job_id, keep=spec.staleness + 2,
                                  retain_s=settings.snapshot_retain_s, dtype=spec.snapshot_dtype,
                                  full_every=spec.snapshot_full_every, adapter=spec.lora)
            server = SnapshotServer(store, host=settings.snapshot_host, port=settings.snapshot_port,
                                    advertise_host=settings.advertise_host).start()
            stack.callback(server.stop)
            relay = None
            if settings.relay and strategies.get(spec.broadcast_strategy).relayed:
                relay = LearnerRelay(store, uplink_bps=spec.learner_uplink_bps, host=settings.snapshot_host,
                                     port=settings.relay_port, advertise_host=settings.advertise_host,
                                     mode=settings.relay_mode)
                stack.callback(relay.stop)
            publisher = cls(site, job_id=job_id, spec=spec, loop=loop, store=store, server=server, relay=relay)
            stack.callback(publisher.outbox.stop)
            yield publisher

    @property
    def relay_address(self) -> str:
        return self.relay.address if self.relay is not None else ""

    @property
    def doors(self) -> str:
        """Where the versions are served, for the log."""
        return self.server.url_for(0) + (f" and relay {self.relay.address}" if self.relay is not None else "")

    def set_secret(self, secret: str | None) -> None:
        """The job's transfer secret (the site's reply to the announcement): both doors admit credential holders."""
        for door in (self.server, self.relay):
            if door is not None:
                door.set_secret(secret)

    def publish_base(self, published_digest: str) -> None:
        """Publish the job's base checkpoint directory as version 0, before any training, so workers need no
        copy of their own (dataplane/basemodel.py). Once per job: a restarted learner whose job has its base
        published only lays it out again when its store lost it, and checks it is still the same files."""
        manifest = self.store.base_manifest() if published_digest else None
        if manifest is None or manifest.sha256 != published_digest:
            manifest = self.store.write_base(self.spec.model_dir)
        if published_digest and manifest.sha256 != published_digest:
            raise SiteError(f"model_dir: the files in {self.spec.model_dir} changed since the job's base snapshot "
                            f"was published (sha256 {manifest.sha256[:12]}..., published {published_digest[:12]}...)")
        if published_digest:
            log.info("base snapshot v0 already published (sha256 %s...)", published_digest[:12])
        self._announce(manifest)  # again after a restart: the site learns the new address it is served at

    def publish_resumed(self, published: int) -> None:
        """After a restart: publish the checkpoint's version if the site lacks the last publication due by then (we
        died before announcing it), else announce the site's newest again from the store: the site keeps the address
        each version was announced at, and an agent still fetching it would wait on the dead process's ports.
        Versions the store wrote after the site's newest never reached the site (no agent holds one): they go, so
        the next delta is against a version the agents may hold."""
        version, kappa = self.loop.version, self.spec.kappa
        if dropped := self.store.forget_after(published):
            log.info("job %s: dropped snapshot(s) %s, never announced to the site", self.job_id, dropped)
        if republish_on_resume(version, kappa=kappa, published_version=published):
            self.publish(version)
        elif published > 0 and (manifest := self.store.manifest(published)) is not None:
            self._announce(manifest)
        elif published > 0:
            log.warning("job %s: snapshot v%d is no longer in %s; agents that lack it wait for v%d", self.job_id,
                        published, self.store.root, version + kappa - version % kappa)

    def publish_due(self, version: int) -> None:
        """After step ``version``: raise (:class:`PublishError`) what the committer's thread met publishing an
        earlier version, else publish this one if it is a multiple of kappa. :attr:`seconds` is the time spent."""
        self.seconds = 0.0
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure
        if version % self.spec.kappa:
            return
        if not self.room.due():  # the disk was full: the next due version after the back-off tries again
            log.info("job %s: v%d not published (%s); trying again in %.0f s", self.job_id, version,
                     self.loop.storage_warning, self.room.until - self.room.clock())
            return
        started = time.perf_counter()
        try:
            self.publish(version)
        except SiteError as err:
            raise PublishError(version, str(err)) from None
        finally:
            self.seconds = time.perf_counter() - started

    def publish_final(self) -> None:
        """The final model between two publications (max_steps or the target not a multiple of kappa) is
        published too: the job's newest snapshot is its final model, which the owner exports (docs/cli.md)."""
        version = self.loop.version
        if version % self.spec.kappa == 0:
            return
        try:
            self.publish(version, background=False)
            log.info("job %s: published the final model as v%d", self.job_id, version)
        except (SiteError, OSError) as err:  # the job's outcome stands; the checkpoint holds the model
            log.error("job %s: could not publish the final model v%d: %s", self.job_id, version, err)

    def publish(self, version: int, *, background: bool = True) -> None:
        """Write snapshot ``version``, offer it on the relay, announce it (now, or once the site answers again);
        the site pushes it to the workers. With ``background``, the version just checkpointed in the background is
        written by the committer's thread from the checkpoint's copy of the weights, after the checkpoint (never
        ahead of it); anything else (a restart's republication, a sharded policy, the final model) here, from the
        policy itself."""
        last, committer = self.loop.last_state, self.loop.committer
        if not background or committer is None or last is None or last[0] != version or not last[1]:
            # a sharded policy's full state is gathered by every rank together: rank 0 cannot ask for it twice
            manifest = self._written(self.loop.trainer.full_state, version,
                                     again=not getattr(self.loop.trainer, "sharded", False))
            if manifest is not None:
                self._announce(manifest)
            return

        def write() -> None:
            try:
                manifest = self._written(lambda: _each_tensor_once(last[1]), version, again=True)
                if manifest is not None:
                    self._announce(manifest)
            except SiteError as err:  # a refusal the outbox met earlier: the training thread fails the job with it
                self._failure = PublishError(version, str(err))

        committer.submit(write)

    def _written(self, weights: Callable[[], Any], version: int, *, again: bool) -> Manifest | None:
        """``store.write`` of ``weights()``; None when the disk is full (learner/diskroom.py): what the store's
        retention allows is dropped first and, ``again``, the write tried once more; then the job page says how much
        room it needs and publications wait out the back-off, while training goes on. Nothing whose checkpoint is not
        on disk is published: a restart would train that version again, and agents would hold another one."""
        if self.loop.unsaved_since is not None and self.loop.unsaved_since <= version:
            log.warning("job %s: v%d not published: its checkpoint is not on disk (%s)", self.job_id, version,
                        self.loop.storage_warning)
            return None
        try:
            manifest = self.store.write(weights(), version)
        except OSError as err:
            if not diskroom.is_full(err):
                raise
            dropped = self.store.prune()
            if not (again and dropped):
                return self._no_room(version, err)
            log.warning("job %s: disk full writing v%d; dropped v%s as retention allows, writing it again",
                        self.job_id, version, dropped)
            try:
                manifest = self.store.write(weights(), version)
            except OSError as err2:
                if not diskroom.is_full(err2):
                    raise
                return self._no_room(version, err2)
        self.room.succeeded()
        self.loop.storage_warning = ""
        return manifest

    def _no_room(self, version: int, err: OSError) -> None:
        known = self.store.manifest(self.version or 0)  # a version as big as the last one published
        needed = (known.full or known).total_bytes if known is not None else 0
        self.loop.storage_warning = diskroom.full_line("snapshot store", needed_bytes=needed, root=self.store.root)
        wait = self.room.failed()
        log.error("job %s: snapshot v%d not written (%s: %s); training goes on, the next due version is tried in "
                  "%.0f s", self.job_id, version, self.loop.storage_warning, err.strerror, wait)

    def _announce(self, manifest: Manifest) -> None:
        version = manifest.version
        if self.relay is not None:  # before the site tells the seeds to connect
            self.relay.serve(version)
        self.outbox.publish(Publication(version, self.server.url_for(version), manifest_json(manifest)))
        self.version = version

    def _announced(self, pub: Publication, reply: dict) -> None:
        """The site took ``pub`` (on the outbox's thread): its chains set the relay's fan-out."""
        n_chains = reply.get("n_chains") or 0
        if self.relay is not None and n_chains:
            self.relay.set_fan_out(pub.version, n_chains)
        kind = pub.manifest.get("kind", "full")
        log.info("published v%d (%s, %s%s, %d bytes)%s", pub.version, pub.manifest.get("format", "safetensors"),
                 kind, f" against v{pub.manifest.get('base_version')}" if kind == "delta" else "",
                 pub.manifest.get("total_bytes", 0),
                 f" to {n_chains} chain(s)" if n_chains else " over HTTP")


def _each_tensor_once(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A checkpoint's copy of the weights as a snapshot publishes them: a tied tensor once, under its first name
    (the copy keeps tied tensors shared, as ``PolicyTrainer.full_state`` gives them)."""
    seen: set[int] = set()
    return {name: t for name, t in state.items() if not (t.data_ptr() in seen or seen.add(t.data_ptr()))}
