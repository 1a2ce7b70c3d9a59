"""Staleness-gated reading of a job's trajectory stream (paper section 4.1, "Replay buffer management").

Entries (one GRPO group each) are read through the ``learner`` consumer group. At learner version
``v_t`` a group is admissible only if ``v >= v_t - S``; older groups are dropped, counted and
acknowledged. An admissible group is acknowledged only once the update that trained on it is in a committed
checkpoint (learner/loop.py), so a crashed learner finds it again among its pending entries on restart.
Within one process, entries are read once (``>``); pending entries are read back only at start-up.
Every group read is first checked against the model's limits (learner/quarantine.py): a bad one is
acknowledged and counted per worker, never buffered, so it can neither crash a step nor come back on resume.
Then a sampled few are audited (learner/audit.py): a worker whose group fails loses that group and every
other group of its that is buffered (acknowledged, counted as ``audit_dropped_records``).
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dataplane.records import RecordLimits
from dataplane.replay import DROPPED_STALE, Client, ReplayBuffer, StoredGroup

from .quarantine import Quarantine, all_fit

if TYPE_CHECKING:
    from .audit import Auditor, Verdict

# A read ahead's blocking reads: how long the training thread may wait for it once it asks for the next batch.
READ_AHEAD_BLOCK_MS = 200
ACKED_MEMORY = 100_000  # acknowledged entry ids remembered (a few MB)


@dataclass
class BatchWait:
    groups: list[StoredGroup]
    dropped: int  # records dropped as stale since the previous batch (timed-out waits included)
    wait_s: float
    quarantined: int = 0  # records quarantined since the previous batch


@dataclass
class StalenessGatedConsumer:
    client: Client
    job_id: int
    staleness: int
    consumer: str = "learner-0"
    buffer: list[StoredGroup] = field(default_factory=list)
    dropped_total: int = 0
    retry_for_s: float = 0.0  # ride out a Redis outage this long per operation (ReplayBuffer)
    limits: RecordLimits | None = None  # what the model takes (None: only the float32-safe bounds)
    audit: Auditor | None = None  # checks every text against its ids, audits a sample (None: none)
    # Read (and parse, and audit) the next batch's entries on a thread of its own while the current batch trains, so
    # a learner whose data came while it trained waits neither for Redis nor for the audits: the thread reads what
    # arrives until it holds the next batch or the next batch is asked for. Gated when the next batch is formed, like
    # any read; read and not trained, it stays pending.
    prefetch: bool = False
    # Called with the groups of every read (on the reader's thread for a read ahead): the learner starts scoring
    # the owner's reward functions there (learner/scoring.py), so they score while the current batch trains.
    on_read: Callable[[list[StoredGroup]], object] | None = None
    _resumed: bool = False

    def __post_init__(self) -> None:
        self.replay = ReplayBuffer(self.client, self.job_id, retry_for_s=self.retry_for_s)
        self.replay.ensure_groups()
        self.held: set[str] = set()  # read and not yet acknowledged: buffered, or handed out and training
        # Acknowledged ids, newest last: a Redis restarted from its AOF may have lost the last second of
        # acknowledgements, and such an entry must be acknowledged again, not trained again.
        self.acked: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._reconnects = 0
        self._dropped_waiting = 0  # records dropped since the last batch, over waits that timed out too
        self.quarantine = Quarantine(self.limits or RecordLimits())
        self._reader = concurrent.futures.ThreadPoolExecutor(1, "echo2-prefetch") if self.prefetch else None
        self._ahead: concurrent.futures.Future | None = None
        self._stop_ahead = threading.Event()  # the next batch is asked for: the read ahead returns what it has

    def admissible(self, group: StoredGroup, version: int) -> bool:
        """``group`` may train the learner at ``version`` (v_t): it lags at most S (``staleness``) behind."""
        return group.version >= version - self.staleness

    def next_batch(self, *, groups: int, version: int, timeout_s: float,
                   on_poll: Callable[[], object] | None = None) -> BatchWait | None:
        """Wait up to ``timeout_s`` for ``groups`` groups admissible at the learner's ``version``; None if they did
        not come (stale ones are dropped and counted meanwhile). ``on_poll`` runs first, before anything here can
        take long, and again after each read (at least once a second; once at the end when no read was needed):
        the learner tops up prompts there, since training or dropping a stale group frees room in the backlog."""
        start = time.monotonic()
        if on_poll is not None:  # workers generate the batch after next while this one is read, audited, trained
            on_poll()
        if not self._resumed:
            self._take(self.replay.read_pending(self.consumer))  # read before a crash, never acknowledged
            self._resumed = True
        if self._ahead is not None:
            ahead, self._ahead = self._ahead, None
            self._stop_ahead.set()
            self._take(*ahead.result())
            self._after_reconnect()
        self._dropped_waiting += self._drop_stale(version)
        polled = False
        while len(self.buffer) < groups:
            left = timeout_s - (time.monotonic() - start)
            if left <= 0:
                return None  # what was dropped meanwhile is reported with the step that ends the wait
            self._take(self.replay.read(self.consumer, count=groups - len(self.buffer),
                                        block_ms=int(min(left, 1.0) * 1000) if polled else 1))
            self._after_reconnect()
            self._dropped_waiting += self._drop_stale(version)
            if on_poll is not None:
                on_poll()
            polled = True
        if on_poll is not None and not polled:
            on_poll()
        batch, self.buffer = self.buffer[:groups], self.buffer[groups:]
        if self._reader is not None and len(self.buffer) < groups:
            self._stop_ahead.clear()
            self._ahead = self._reader.submit(self._read_ahead, groups - len(self.buffer))
        dropped, self._dropped_waiting = self._dropped_waiting, 0
        quarantined, self.quarantine.since_batch = self.quarantine.since_batch, 0
        return BatchWait(groups=batch, dropped=dropped, wait_s=time.monotonic() - start, quarantined=quarantined)

    def _read_ahead(self, count: int) -> tuple[list[StoredGroup], dict[str, Verdict | None] | None]:
        """On the reader's thread: up to ``count`` groups, read as they arrive until the training thread asks for
        the next batch (short blocking reads, so it is never kept waiting long), and the audits of the sampled ones
        when every group read fits the model (an audit scores it: it must not hold a token id past the vocabulary);
        the training thread gates, quarantines and buffers them when it forms the next batch."""
        groups: list[StoredGroup] = []
        while True:
            read = self.replay.read(self.consumer, count=count - len(groups),
                                    block_ms=1 if self._stop_ahead.is_set() else READ_AHEAD_BLOCK_MS)
            if self.on_read is not None and read:
                self.on_read(read)
            groups.extend(read)
            if len(groups) >= count or self._stop_ahead.is_set() or self.replay.reconnects != self._reconnects:
                break
        if self.audit is None or any(g.packed is None for g in groups) or \
                not all_fit([g.packed for g in groups], self.quarantine.limits):
            return groups, None
        return groups, self.audit.verdicts(groups)

    def close(self) -> None:
        """Let a read ahead finish (what it read stays pending: a restart reads it again) and stop its thread."""
        if self._reader is not None:
            self._stop_ahead.set()
            self._reader.shutdown(wait=True)

    def _after_reconnect(self) -> None:
        if self.replay.reconnects != self._reconnects:
            # A read whose reply was lost with the connection delivered entries we never saw: they are
            # pending under our name, so take every pending entry we do not hold yet.
            self._reconnects = self.replay.reconnects
            self._take(self.replay.read_pending(self.consumer))

    def ack(self, groups: list[StoredGroup]) -> None:
        """Acknowledge trained groups (and delete them: the stream is a queue, not an archive)."""
        self.ack_ids([g.entry_id for g in groups])

    def ack_ids(self, ids: list[str]) -> None:
        """Acknowledge and delete entries by id; ids already acknowledged are ignored."""
        self.replay.ack(ids)
        self.acknowledged(ids)

    def acknowledged(self, ids: list[str]) -> None:
        """Note entries acknowledged by someone else (the learner's committer thread, after its checkpoint)."""
        self.held.difference_update(ids)
        for entry_id in ids:
            self.acked[entry_id] = None
        while len(self.acked) > ACKED_MEMORY:
            self.acked.popitem(last=False)

    def _take(self, groups: list[StoredGroup], verdicts: dict[str, Verdict | None] | None = None) -> None:
        """Buffer groups not already held (a pending entry re-read after a reconnect may be one we hold);
        quarantine the ones the model must not see (acknowledged at once, counted per worker); audit the sampled
        ones (``verdicts``: their audits, already done by the read ahead)."""
        again = [g.entry_id for g in groups if g.entry_id in self.acked]
        if again:
            self.replay.ack(again)
        new: list[StoredGroup] = []
        for group in groups:
            if group.entry_id not in self.held and group.entry_id not in self.acked:
                self.held.add(group.entry_id)
                new.append(group)
        good, bad, quarantined = self.quarantine.split(new)
        if self.audit is not None:
            good = self._audited(good, verdicts)
        if self.on_read is not None and good:
            self.on_read(good)
        self.buffer.extend(good)
        if bad:
            self.ack(bad)
            self.replay.count("quarantined_records", quarantined)

    def _audited(self, groups: list[StoredGroup], verdicts: dict[str, Verdict | None] | None) -> list[StoredGroup]:
        """``groups`` without those of workers that just failed an audit; their buffered groups go too."""
        kept, failed = self.audit.screen(groups, verdicts)
        if not failed:
            return kept
        gone = [g for g in groups if g not in kept] + [g for g in self.buffer + kept if g.worker_id in failed]
        self.buffer = [g for g in self.buffer if g.worker_id not in failed]
        self.ack(gone)
        for stored in gone:
            self.audit.dropped(stored.worker_id, stored.size)
        self.replay.count("audit_dropped_records", sum(g.size for g in gone))
        return [g for g in kept if g.worker_id not in failed]

    def _drop_stale(self, version: int) -> int:
        stale = [g for g in self.buffer if not self.admissible(g, version)]
        self.buffer = [g for g in self.buffer if self.admissible(g, version)]
        return self._drop(stale)

    def _drop(self, groups: list[StoredGroup]) -> int:
        ids = [g.entry_id for g in groups]
        self.replay.ack_counted([(g.entry_id, g.size) for g in groups], DROPPED_STALE)
        self.acknowledged(ids)
        n = sum(g.size for g in groups)
        self.dropped_total += n
        return n
