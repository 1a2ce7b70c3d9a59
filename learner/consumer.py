"""Staleness-gated reading of a job's trajectory stream (paper section 4.1, "Replay buffer management").

Entries (one GRPO group each) are read through the ``learner`` consumer group. At learner version
``v_t`` a group is admissible only if ``v >= v_t - S``; older groups are dropped, counted and
acknowledged. An admissible group is acknowledged only once the update that trained on it is in a committed
checkpoint (learner/loop.py), so a crashed learner finds it again among its pending entries on restart.
Within one process, entries are read once (``>``); pending entries are read back only at start-up.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from dataplane.replay import Client, ReplayBuffer, StoredGroup

ACKED_MEMORY = 100_000  # acknowledged entry ids remembered (a few MB)


@dataclass
class BatchWait:
    groups: list[StoredGroup]
    dropped: int  # records dropped as stale since the previous batch (timed-out waits included)
    wait_s: float


@dataclass
class StalenessGatedConsumer:
    client: Client
    job_id: int
    staleness: int
    consumer: str = "learner-0"
    buffer: list[StoredGroup] = field(default_factory=list)
    dropped_total: int = 0
    retry_for_s: float = 0.0  # ride out a Redis outage this long per operation (ReplayBuffer)
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

    def admissible(self, group: StoredGroup, learner_version: int) -> bool:
        return group.version >= learner_version - self.staleness

    def next_batch(self, *, groups: int, learner_version: int, timeout_s: float,
                   on_poll: Callable[[], object] | None = None) -> BatchWait | None:
        """Wait up to ``timeout_s`` for ``groups`` admissible groups; None if they did not come. ``on_poll``
        runs after each read (at least once a second): the learner tops up prompts there, since dropping a
        stale group frees room in the backlog while the wait goes on."""
        start = time.monotonic()
        if not self._resumed:
            self._take(self.replay.read_pending(self.consumer))  # read before a crash, never acknowledged
            self._resumed = True
        self._dropped_waiting += self._drop_stale(learner_version)
        while len(self.buffer) < groups:
            left = timeout_s - (time.monotonic() - start)
            if left <= 0:
                return None  # what was dropped meanwhile is reported with the step that ends the wait
            self._take(self.replay.read(self.consumer, count=groups - len(self.buffer),
                                        block_ms=int(min(left, 1.0) * 1000)))
            if self.replay.reconnects != self._reconnects:
                # A read whose reply was lost with the connection delivered entries we never saw: they are
                # pending under our name, so take every pending entry we do not hold yet.
                self._reconnects = self.replay.reconnects
                self._take(self.replay.read_pending(self.consumer))
            self._dropped_waiting += self._drop_stale(learner_version)
            if on_poll is not None:
                on_poll()
        batch, self.buffer = self.buffer[:groups], self.buffer[groups:]
        dropped, self._dropped_waiting = self._dropped_waiting, 0
        return BatchWait(groups=batch, dropped=dropped, wait_s=time.monotonic() - start)

    def ack(self, groups: list[StoredGroup]) -> None:
        """Acknowledge trained groups (and delete them: the stream is a queue, not an archive)."""
        self.ack_ids([g.entry_id for g in groups])

    def ack_ids(self, ids: list[str]) -> None:
        """Acknowledge and delete entries by id; ids already acknowledged are ignored."""
        self.replay.ack(ids)
        self.held.difference_update(ids)
        for entry_id in ids:
            self.acked[entry_id] = None
        while len(self.acked) > ACKED_MEMORY:
            self.acked.popitem(last=False)

    def _take(self, groups: list[StoredGroup]) -> None:
        """Buffer groups not already held (a pending entry re-read after a reconnect may be one we hold)."""
        again = [g.entry_id for g in groups if g.entry_id in self.acked]
        if again:
            self.replay.ack(again)
        for group in groups:
            if group.entry_id not in self.held and group.entry_id not in self.acked:
                self.held.add(group.entry_id)
                self.buffer.append(group)

    def _drop_stale(self, learner_version: int) -> int:
        stale = [g for g in self.buffer if not self.admissible(g, learner_version)]
        self.buffer = [g for g in self.buffer if self.admissible(g, learner_version)]
        return self._drop(stale)

    def _drop(self, groups: list[StoredGroup]) -> int:
        self.ack(groups)
        n = sum(len(g.records) for g in groups)
        self.dropped_total += n
        return n
