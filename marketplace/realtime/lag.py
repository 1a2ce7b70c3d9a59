"""How late this site process runs, and the share of their budget it tells its agents to use because of it.

Under load (60 emulated agents and 3 real ones on one site process) replies took longer than the agents waited;
they sent again, leases expired and the job failed. Rather than let that happen, a process that runs late announces
a lower message budget (a ``welcome`` again, which agents take at any time: ``worker_agent/connection.py
welcome``): agents then batch more groups per message and ask less often (``worker_agent.rollout_loop.batch_size``),
which costs the site less per group, before their leases expire. Per process: each site process sheds its own load.

Two signals, either enough: rollout replies that take longer than ``ECHO2_REPLY_LAG_S`` on average (a database or
Redis that answers late), and an event loop that runs its timers later than ``ECHO2_LOOP_LAG_S`` (a process short
of CPU: every frame it reads, heartbeats included, waits as long, and then some). The share is halved after every
``ADJUST_EVERY_S`` period in which half the probes or more ran late (or the replies lagged), down to ``MIN_SHARE``, and
raised by a quarter after every period that ran well on time: a controller, not a fixed map from lag to share, since
a share that relieves the loop takes the lag away with it. A moment's lateness (a garbage collection, a burst of
hellos) changes nothing.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections.abc import Callable

MIN_SHARE = 0.02  # of the configured budget: at the default 50 messages/s, 1 (an agent's heartbeats take 0.5)
SMOOTHING = 0.2  # weight of a new sample in the replies' moving average
PROBE_EVERY_S = 0.1  # how often the loop's probe asks to run
ADJUST_EVERY_S = 2.0  # the share changes at most this often
LATE_SHARE = 0.5  # of a period's probes late (past the loop's limit), or more: shed
QUIET_SHARE = 0.1  # of a period's probes late, or fewer (and the replies on time): raise the share again
RAISE_BY = 1.25  # the share's step back up after a period on time
MIN_MESSAGES_PER_S = 1.0  # never announced lower (unless the budget is): an agent's heartbeats and a round trip


class LagMeter:
    """The moving average of how long rollout messages take to answer, in seconds (thread-safe)."""

    def __init__(self) -> None:
        self.average = 0.0
        self._lock = threading.Lock()

    def add(self, seconds: float) -> None:
        with self._lock:
            self.average += SMOOTHING * (max(0.0, seconds) - self.average)


class _Probe:
    """Asks its loop to run it every ``PROBE_EVERY_S`` and counts the runs that came later than a limit."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = weakref.ref(loop)  # the loop holds the probe's timer; the probe must not hold the loop
        self.runs = self.late = 0
        self.last_s = 0.0  # how late the last run came
        self.limit_s = float("inf")
        self._due = loop.time() + PROBE_EVERY_S
        loop.call_at(self._due, self._run)

    def _run(self) -> None:
        loop = self._loop()
        if loop is None or loop.is_closed():
            return
        now = loop.time()
        self.last_s = now - self._due
        self.runs += 1
        self.late += self.last_s > self.limit_s
        self._due = now + PROBE_EVERY_S
        loop.call_at(self._due, self._run)

    def take(self) -> tuple[int, int]:
        """(runs, late runs) since the last take."""
        counts, self.runs, self.late = (self.runs, self.late), 0, 0
        return counts


class Shedding:
    """The share of the configured budget this process announces (:meth:`share`), from the running loop's probe
    and the replies' :class:`LagMeter`."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.replies = LagMeter()
        self.current = 1.0
        self._adjusted_at: float | None = None
        self._probes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Probe] = weakref.WeakKeyDictionary()

    def share(self, *, loop_lag_s: float, reply_lag_s: float) -> float:
        """The share to announce now, adjusted once a period has passed since the last adjustment (call it from the
        event loop whose lateness counts)."""
        loop = asyncio.get_running_loop()
        probe = self._probes.get(loop)
        if probe is None:
            probe = self._probes[loop] = _Probe(loop)
        probe.limit_s = loop_lag_s
        now = self.clock()
        if self._adjusted_at is None:
            self._adjusted_at = now
        if now - self._adjusted_at < ADJUST_EVERY_S:
            return self.current
        self._adjusted_at = now
        runs, late = probe.take()
        replies = self.replies.average
        if replies > reply_lag_s or (runs and late >= LATE_SHARE * runs):
            self.current = max(MIN_SHARE, self.current / 2)
        elif replies <= reply_lag_s / 2 and late <= QUIET_SHARE * runs:
            self.current = min(1.0, self.current * RAISE_BY)
        return self.current

    def loop_lag(self) -> float:
        """How late the running loop's probe ran last, in seconds (0 before it ran)."""
        probe = self._probes.get(asyncio.get_running_loop())
        return probe.last_s if probe is not None else 0.0


SHEDDING = Shedding()
