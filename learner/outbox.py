"""What the learner owes the site while the site is down: step reports and the newest publication.

A site outage (connection refused, timeouts, 5xx) must not stop training: the learner keeps training
while it has data, queues its reports in order and remembers the newest snapshot to announce, and sends
all of it once the site answers again. While the site is down each attempt is a single try (no backoff
sleeps inside a training step). A refusal (4xx) is not an outage: it is raised to the caller.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from .client import SiteClient, SiteUnreachable

log = logging.getLogger("echo2.learner")


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
        self.publication: Publication | None = None
        self.down_since: float | None = None

    @property
    def pending(self) -> int:
        return len(self.reports) + (self.publication is not None)

    def report(self, metrics: dict) -> None:
        """Send one step's metrics now, or after the ones still queued once the site is back."""
        self.reports.append(metrics)
        self.flush()

    def publish(self, publication: Publication) -> None:
        """Announce a snapshot now or when the site is back; a newer one replaces one not yet announced."""
        self.publication = publication
        self.flush()

    def flush(self, *, retries: int | None = None) -> bool:
        """Send what is owed, oldest first; True when nothing is left. ``retries`` defaults to the client's
        while the site answers and to a single try while it is down."""
        if retries is None and self.down_since is not None:
            retries = 0
        try:
            if self.publication is not None:
                pub = self.publication
                reply = self.site.publish(self.job_id, version=pub.version, url=pub.url, manifest=pub.manifest,
                                          retries=retries)
                self.publication = None
                self.on_published(pub, reply or {})
            while self.reports:
                self.site.report(self.job_id, self.reports[0], retries=retries)
                self.reports.popleft()
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

    def drain(self, *, within_s: float, pause_s: float = 5.0) -> bool:
        """Keep trying (with the client's retries) until everything is sent or ``within_s`` passed."""
        deadline = self.clock() + within_s
        while not self.flush(retries=None if self.down_since is None else 1):
            if self.clock() >= deadline:
                return False
            time.sleep(pause_s)
        return True
