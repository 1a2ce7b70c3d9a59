"""The learner's side of the trajectory stream in the fleet simulator: reading admissible groups, dropping stale ones
(learner/consumer.py ``next_batch``) and refilling the prompt backlog (learner/prompts.py). A part of
:class:`simulator.fleet.FleetSim`, which holds the stream (``buffer``), what the learner read (``taken``), the free
backlog slots (``tokens``) and the clock.

With no latencies (``read_rtt_s`` and ``top_up_latency_s`` 0, the default) the stream is read whole at once and a
freed slot is free at once. On a WAN (bench/sim_wan.py) Redis sits at the site: each read takes at most the groups
still missing and costs the learner's round trip to it, and so does acknowledging dropped ones; the prompt feeder is
a background top-up asked at every read, one at a time (asked while one runs, it is left to the next read, and a read
that finds nothing blocks up to 1 s), its prompts landing ``top_up_latency_s`` after it started.
"""

from __future__ import annotations

import collections

READ_BLOCK_S = 1.0  # the consumer's longest blocking read (learner/consumer.py): the next poll at the latest


class Stream:
    """The learner's reads and top-ups of :class:`~simulator.fleet.FleetSim`."""

    def _drop_stale(self) -> int:
        floor, kept, dropped = self.version - self.cfg.learner.staleness, collections.deque(), 0
        for version, records in self.taken:
            if version >= floor:
                kept.append((version, records))
            else:
                dropped += 1
                self.res.dropped += records
        self.taken = kept
        return dropped

    def _gather(self, groups: int):
        """Read until ``groups`` admissible groups are held, dropping the stale ones; a read that waited for data
        returns as it lands."""
        rtt, blocked = self.cfg.read_rtt_s, False
        while True:
            if freed := self._drop_stale():
                if rtt:
                    yield self.env.timeout(rtt)  # their acknowledgement
                self._top_up(freed)
            self._poll()
            if len(self.taken) >= groups:
                return
            if not self.buffer:
                self.data = self.env.event()
                yield (self.data | self.env.timeout(READ_BLOCK_S)) if self.cfg.top_up_latency_s else self.data
                blocked = True
                continue
            if rtt and not blocked:
                yield self.env.timeout(rtt)
            want = groups - len(self.taken) if rtt else len(self.buffer)
            for _ in range(min(want, len(self.buffer))):
                self.taken.append(self.buffer.popleft())
            blocked = False

    def _top_up(self, groups: int) -> None:
        """``groups`` slots freed (trained or dropped): free at once, or filled by the feeder at its next poll."""
        if self.cfg.top_up_latency_s:
            self.freed += groups
        else:
            self.tokens.put(groups)

    def _poll(self) -> None:
        if self.freed and not self.topping:
            self.topping = True
            self.env.process(self._feed(self.freed))
            self.freed = 0

    def _feed(self, groups: int):
        yield self.env.timeout(self.cfg.top_up_latency_s)
        yield self.tokens.put(groups)
        self.topping = False
