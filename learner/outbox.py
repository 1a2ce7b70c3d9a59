"""What the learner owes the site while the site is down: step reports and the newest publication.

A site outage (connection refused, timeouts, 5xx) must not stop training: the learner keeps training while it
has data, queues its reports in order and remembers the newest snapshot to announce, and sends all of it once
the site answers again. A newer full snapshot replaces every publication not yet announced but the base
(version 0); a delta (docs/broadcast.md "Formats") queues behind the version it applies to, since an agent can
only apply it on top of that one: what waits is at most the base, a full snapshot and the deltas after it
(at most ``learner.snapshots.MAX_UNANNOUNCED`` of them: the store then writes the next version full). While the
site is down each attempt is a single try (no backoff sleeps inside a training step). A refusal (4xx) is not an
outage: it is raised to the caller.

Started (:meth:`Outbox.start`), a sender thread does the sending, so the training thread only appends to the
queue (the learner spent 31% of its main thread in synchronous reports); the same goes for the T_train it announces
every ten steps (the newest replaces one not yet sent). The queue is bounded (``MAX_QUEUED``
reports, about an hour of steps): past it, ``report`` waits for room rather than drop one. A refusal met by the
sender is raised by the next ``report`` or ``publish`` call of the training thread.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .client import SiteClient, SiteError, SiteUnreachable

log = logging.getLogger("echo2.learner")

MAX_QUEUED = 20_000


@dataclass(frozen=True)
class Publication:
    version: int
    url: str
    manifest: dict


class Outbox:
    def __init__(self, site: SiteClient, job_id: int, *, on_published: Callable[[Publication, dict], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.site, self.job_id, self.on_published, self.clock = site, job_id, on_published, clock
        self.reports: collections.deque[dict] = collections.deque()
        self.publications: collections.deque[Publication] = collections.deque()
        self.t_train: float | None = None  # the newest T_train to announce (a newer one replaces it)
        self.down_since: float | None = None
        self.lock = threading.Condition()  # guards what is queued; the sender waits on it
        self.sending = threading.Lock()  # one sender at a time (the thread, or drain at the end)
        self.refusal: Exception | None = None  # a 4xx the sender met, raised to the training thread
        self.thread: threading.Thread | None = None
        self.stopping = False

    @property
    def pending(self) -> int:
        return len(self.reports) + len(self.publications) + (self.t_train is not None)

    def pending_versions(self) -> set[int]:
        """The versions published and not announced yet: the store keeps them (learner/snapshots.py)."""
        with self.lock:
            return {pub.version for pub in self.publications}

    def queued_reports(self) -> list[dict]:
        """The step reports not sent yet, oldest first: a checkpoint keeps them (learner/loop.py)."""
        with self.lock:
            return list(self.reports)

    def resend(self, kept: dict, reported_version: int) -> None:
        """Queue the reports a checkpoint kept (its ``state``) that the site never got: the learner died before
        sending them, and several steps' may have been waiting for this thread. A checkpoint from before that
        kept only its own step's report, under ``report``. ``reported_version``: the newest step the site has (its
        ``learner_step``)."""
        reports = kept.get("reports")
        for owed in reports if reports is not None else [kept.get("report")]:
            if owed and int(owed.get("step", 0)) > reported_version:
                self.report(owed)

    def start(self) -> Outbox:
        """Send from a thread of its own from now on (see the module docstring)."""
        self.thread = threading.Thread(target=self._send_forever, name="echo2-outbox", daemon=True)
        self.thread.start()
        return self

    def report(self, metrics: dict) -> None:
        """Send one step's metrics now, or after the ones still queued once the site is back."""
        self._raise_refusal()
        with self.lock:
            while self.thread is not None and len(self.reports) >= MAX_QUEUED:
                self.lock.wait(1.0)  # the site has been down for a long time: wait for room, lose nothing
            self.reports.append(metrics)
            self.lock.notify_all()
        if self.thread is None:
            self.flush()

    def publish(self, publication: Publication) -> None:
        """Announce a snapshot now or when the site is back: a full one replaces those not yet announced but the
        base (version 0: every agent that joins later starts from it), a delta goes after them (its base among
        them)."""
        self._raise_refusal()
        with self.lock:
            if publication.manifest.get("kind", "full") != "delta":
                kept = [pub for pub in self.publications if pub.version == 0 and publication.version > 0]
                self.publications.clear()
                self.publications.extend(kept)
            self.publications.append(publication)
            self.lock.notify_all()
        if self.thread is None:
            self.flush()

    def announce(self, t_train: float | None) -> None:
        """Tell the site the learner's current T_train (the provisioning input); only the newest is sent."""
        self._raise_refusal()
        with self.lock:
            self.t_train = t_train
            self.lock.notify_all()
        if self.thread is None:
            self.flush()

    def stop(self) -> None:
        """Stop the sender thread (what is still queued stays: ``drain`` sends it)."""
        with self.lock:
            self.stopping = True
            self.lock.notify_all()
        if self.thread is not None:
            self.thread.join(timeout=60)
            self.thread = None

    def _raise_refusal(self) -> None:
        if self.refusal is not None:
            refusal, self.refusal = self.refusal, None
            raise refusal

    def _send_forever(self) -> None:
        while True:
            with self.lock:
                while not self.stopping and not (self.reports or self.publications or self.t_train is not None):
                    self.lock.wait()
                if self.stopping:
                    return
            try:
                sent = self.flush()
            except Exception as err:  # noqa: BLE001 - a refusal (4xx) or a bug: the training thread decides
                self.refusal = err
                with self.lock:  # drop what was refused, or it would be refused forever
                    if self.reports:
                        self.reports.popleft()
                sent = True
            if not sent:
                time.sleep(1.0)  # the site is down: one try a second, never a busy loop

    def flush(self, *, retries: int | None = None) -> bool:
        """Send what is owed, oldest first; True when nothing is left. ``retries`` defaults to the client's
        while the site answers and to a single try while it is down."""
        if retries is None and self.down_since is not None:
            retries = 0
        with self.sending:
            return self._flush(retries)

    def _flush(self, retries: int | None) -> bool:
        try:
            while True:
                with self.lock:
                    pub, t_train = self.publications[0] if self.publications else None, self.t_train
                    head = self.reports[0] if self.reports else None
                if t_train is not None:
                    self._announce(t_train, retries)
                elif pub is not None:
                    reply = self.site.publish(self.job_id, version=pub.version, url=pub.url, manifest=pub.manifest,
                                              retries=retries)
                    with self.lock:
                        if self.publications and self.publications[0] is pub:  # not replaced by a full one meanwhile
                            self.publications.popleft()
                    self.on_published(pub, reply or {})
                elif head is not None:
                    self.site.report(self.job_id, head, retries=retries)
                    with self.lock:
                        self.reports.popleft()
                        self.lock.notify_all()
                else:
                    break
        except SiteUnreachable as err:
            if self.down_since is None:
                self.down_since = self.clock()
                log.warning("job %s: the site does not answer (%s); training on, reports queued", self.job_id, err)
            return False
        if self.down_since is not None:
            log.info("job %s: the site answers again after %.0f s; queued reports sent", self.job_id,
                     self.clock() - self.down_since)
            self.down_since = None
        return True

    def _announce(self, t_train: float, retries: int | None) -> None:
        """Send T_train; a refusal is the training thread's to see (at its next report), not a reason to stop."""
        try:
            self.site.announce(self.job_id, t_train=t_train, retries=retries)
        except SiteUnreachable:
            raise
        except SiteError as err:
            self.refusal = err
        with self.lock:
            if self.t_train == t_train:  # not replaced by a newer one meanwhile
                self.t_train = None

    def drain(self, *, within_s: float, pause_s: float = 5.0) -> bool:
        """Stop the sender thread, then keep trying (with the client's retries) until everything is sent or
        ``within_s`` passed. Raises a refusal the sender met and nobody was told of yet."""
        self.stop()
        self._raise_refusal()
        deadline = self.clock() + within_s
        while not self.flush(retries=None if self.down_since is None else 1):
            if self.clock() >= deadline:
                return False
            time.sleep(pause_s)
        return True
