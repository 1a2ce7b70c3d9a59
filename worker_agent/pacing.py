"""The agent keeps under the budget its site announces, so an honest agent is never refused.

The site enforces a token bucket of messages and one of bytes per connection (``dataplane.budget``) and announces
them in its ``welcome``. The agent paces every frame it sends through the same arithmetic at ``SHARE`` of the
announced rates, and starts each connection with a small burst (one second of its rate), so a fleet that
reconnects together after an outage does not arrive as one burst. Before a ``welcome`` (or from a site that
announces nothing) only the handshake goes out: nothing waits on an unknown budget, as older sites had none.

A refusal all the same (another process of ours on the same key, a clock hiccup) holds every send until its
``retry_after`` has passed: :meth:`Pacer.hold`.
"""

from __future__ import annotations

import asyncio
import time

from dataplane.budget import ConnectionBudget

SHARE = 0.8  # of the announced rates: room for the clocks' and the network's jitter


class Pacer:
    """Waits before each frame until the budget lets it pass. Coroutines share one pacer per connection."""

    def __init__(self, *, share: float = SHARE) -> None:
        self.share = share
        self.budget: ConnectionBudget | None = None
        self.paused_until = 0.0
        self._lock = asyncio.Lock()

    def configure(self, *, messages_per_s: float | None, message_burst: float | None,
                  bytes_per_s: float | None, max_frame: int) -> None:
        """The budget a ``welcome`` announced (None: the site announced none, nothing is paced)."""
        if messages_per_s is None:
            self.budget = None
            return
        rate = messages_per_s * self.share
        burst = max(1.0, (message_burst or messages_per_s) * self.share)
        self.budget = ConnectionBudget(messages_per_s=rate, message_burst=burst,
                                       bytes_per_s=bytes_per_s * self.share if bytes_per_s else None,
                                       byte_burst=max(float(max_frame), 2 * max_frame * self.share),
                                       start_messages=min(burst, max(1.0, rate)))

    def hold(self, seconds: float) -> None:
        """The site refused a frame: send nothing for ``seconds``."""
        self.paused_until = max(self.paused_until, time.monotonic() + seconds)

    @property
    def rate(self) -> float | None:
        """Messages per second this agent allows itself (None: unpaced)."""
        return self.budget.messages_per_s if self.budget else None

    async def wait(self, size: int) -> None:
        """Return once a frame of ``size`` bytes may go, counting it. Frames go in the order they asked."""
        async with self._lock:
            while True:
                now = time.monotonic()
                wait = max(self.paused_until - now, self.budget.wait(size, now=now) if self.budget else 0.0)
                if wait <= 0:
                    break
                await asyncio.sleep(wait)
            if self.budget is not None:
                self.budget.spend(size, now=time.monotonic())
