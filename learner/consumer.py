"""Staleness-gated reading of a job's trajectory stream (paper section 4.1, "Replay buffer management").

Entries (one GRPO group each) are read through the ``learner`` consumer group. At learner version
``v_t`` a group is admissible only if ``v >= v_t - S``; older groups are dropped, counted and
acknowledged. An admissible group is acknowledged only once the update that trained on it is in a committed
checkpoint (learner/loop.py), so a crashed learner finds it again among its pending entries on restart.
Within one process, entries are read once (``>``); pending entries are read back only at start-up.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import redis

from dataplane import streams
from dataplane.records import Trajectory


@dataclass
class Group:
    entry_id: str
    records: list[Trajectory]

    @property
    def version(self) -> int:
        return min(r.version for r in self.records)


@dataclass
class BatchWait:
    groups: list[Group]
    dropped: int  # records dropped as stale while waiting
    wait_s: float


@dataclass
class StalenessGatedConsumer:
    client: redis.Redis
    job_id: int
    staleness: int
    consumer: str = "learner-0"
    buffer: list[Group] = field(default_factory=list)
    dropped_total: int = 0
    _resumed: bool = False

    def __post_init__(self) -> None:
        self.key = streams.trajectories_key(self.job_id)
        try:
            self.client.xgroup_create(self.key, streams.LEARNER_GROUP, id="0", mkstream=True)
        except redis.ResponseError as err:
            if "BUSYGROUP" not in str(err):
                raise

    def admissible(self, group: Group, learner_version: int) -> bool:
        return group.version >= learner_version - self.staleness

    def next_batch(self, *, groups: int, learner_version: int, timeout_s: float) -> BatchWait | None:
        """Wait up to ``timeout_s`` for ``groups`` admissible groups; None if they did not come."""
        start = time.monotonic()
        if not self._resumed:
            self._resume_pending()
        dropped = self._drop_stale(learner_version)
        while len(self.buffer) < groups:
            left = timeout_s - (time.monotonic() - start)
            if left <= 0:
                return None
            for group in self._read(block_ms=int(min(left, 1.0) * 1000), count=groups - len(self.buffer)):
                if self.admissible(group, learner_version):
                    self.buffer.append(group)
                else:
                    dropped += self._drop([group])
        batch, self.buffer = self.buffer[:groups], self.buffer[groups:]
        return BatchWait(groups=batch, dropped=dropped, wait_s=time.monotonic() - start)

    def ack(self, groups: list[Group]) -> None:
        """Acknowledge trained groups (and delete them: the stream is a queue, not an archive)."""
        self.ack_ids([g.entry_id for g in groups])

    def ack_ids(self, ids: list[str]) -> None:
        """Acknowledge and delete entries by id; ids already acknowledged are ignored."""
        if ids:
            pipe = self.client.pipeline()
            pipe.xack(self.key, streams.LEARNER_GROUP, *ids)
            pipe.xdel(self.key, *ids)
            pipe.execute()

    def _drop_stale(self, learner_version: int) -> int:
        stale = [g for g in self.buffer if not self.admissible(g, learner_version)]
        self.buffer = [g for g in self.buffer if self.admissible(g, learner_version)]
        return self._drop(stale)

    def _drop(self, groups: list[Group]) -> int:
        self.ack(groups)
        n = sum(len(g.records) for g in groups)
        self.dropped_total += n
        return n

    def _resume_pending(self) -> None:
        """Buffer the entries this consumer read before a crash and never acknowledged."""
        last = "0"
        while True:
            reply = self.client.xreadgroup(streams.LEARNER_GROUP, self.consumer, {self.key: last}, count=256)
            entries = reply[0][1] if reply else []
            if not entries:
                break
            self.buffer.extend(self._parse(reply))
            last = entries[-1][0]
        self._resumed = True

    def _read(self, *, block_ms: int, count: int) -> list[Group]:
        return self._parse(self.client.xreadgroup(streams.LEARNER_GROUP, self.consumer, {self.key: ">"},
                                                  count=max(count, 1), block=max(block_ms, 1)))

    def _parse(self, reply) -> list[Group]:
        entries = reply[0][1] if reply else []
        out = []
        for entry_id, fields in entries:
            entry_id = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
            if not fields:  # deleted while still pending: nothing to train on, so acknowledge it
                self.client.xack(self.key, streams.LEARNER_GROUP, entry_id)
                continue
            data = fields.get("data") or fields.get(b"data")
            out.append(Group(entry_id, [Trajectory.model_validate(r) for r in json.loads(data)]))
        return out
