"""How late this site process answers agents, and the share of their budget to announce because of it.

Under load (60 emulated agents and 3 real ones on one site process) replies took longer than the agents waited;
they sent again, leases expired and the job failed. Rather than let that happen, a process that answers rollout
messages later than ``ECHO2_REPLY_LAG_S`` on average announces a lower message budget (a ``welcome`` again, which
agents take at any time: ``worker_agent/connection.py welcome``): agents then batch more groups per message and
ask less often, before their leases expire. The budget comes back as the lag does. Per process: each site
process sheds its own load.
"""

from __future__ import annotations

import threading

MIN_SHARE = 0.1  # never below a tenth of the configured budget: agents must still be able to return work
SMOOTHING = 0.2  # weight of a new sample in the moving average


class LagMeter:
    """The moving average of how long rollout messages take to answer, in seconds (thread-safe)."""

    def __init__(self) -> None:
        self.average = 0.0
        self._lock = threading.Lock()

    def add(self, seconds: float) -> None:
        with self._lock:
            self.average += SMOOTHING * (max(0.0, seconds) - self.average)

    def share(self, *, lag_s: float) -> float:
        """The share of the configured budget to announce: 1 while answers take under ``lag_s`` on average, then
        in proportion (twice as late: half the messages), at least ``MIN_SHARE``."""
        average = self.average
        if average <= lag_s:
            return 1.0
        return max(MIN_SHARE, lag_s / average)


REPLIES = LagMeter()
