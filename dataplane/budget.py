"""A connection's message budget, as the site enforces it and an honest agent keeps under it.

The site gives every agent connection a token bucket of messages and one of bytes, and announces both in its
``welcome`` (``messages_per_s``, ``message_burst``, ``bytes_per_s``). A frame over budget is refused unread with
``retry_after`` (nothing applied, the same request may come again then); the agent paces itself with the same
arithmetic (``worker_agent/pacing.py``) at a share of the announced rates, so an honest agent never meets the
refusal. One implementation for both sides, so the agent's idea of the budget and the site's cannot drift.

Plain arithmetic over an explicit clock (``now``, monotonic seconds): no asyncio, no Django.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Bucket:
    """``rate`` units per second on average, ``burst`` at once; it starts holding ``start`` (default: full)."""

    rate: float
    burst: float
    start: float | None = None
    _tokens: float = field(init=False)
    _stamp: float | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if not self.rate > 0 or not self.burst > 0:
            raise ValueError(f"a budget needs rate > 0 and burst > 0, got {self.rate} and {self.burst}")
        self._tokens = self.burst if self.start is None else min(self.burst, self.start)

    def _refill(self, now: float) -> None:
        if self._stamp is not None:
            self._tokens = min(self.burst, self._tokens + max(0.0, now - self._stamp) * self.rate)
        self._stamp = now

    def wait(self, amount: float = 1.0, *, now: float) -> float:
        """Seconds until ``amount`` may pass (0: now). An amount above the burst waits for a full bucket."""
        self._refill(now)
        need = min(amount, self.burst) - self._tokens
        return 0.0 if need <= 0 else need / self.rate

    def spend(self, amount: float = 1.0, *, now: float) -> None:
        """Count ``amount`` as passed (after :meth:`wait` said 0, or regardless: the balance may go below zero)."""
        self._refill(now)
        self._tokens -= amount


@dataclass
class ConnectionBudget:
    """Messages and bytes of one connection. ``bytes_per_s`` None: bytes are not limited."""

    messages_per_s: float
    message_burst: float
    bytes_per_s: float | None = None
    byte_burst: float | None = None
    start_messages: float | None = None  # tokens held at the start (default: a full burst)
    messages: Bucket = field(init=False)
    bytes: Bucket | None = field(init=False)

    def __post_init__(self) -> None:
        self.messages = Bucket(self.messages_per_s, self.message_burst, start=self.start_messages)
        self.bytes = None
        if self.bytes_per_s is not None:
            burst = self.byte_burst if self.byte_burst is not None else self.bytes_per_s
            self.bytes = Bucket(self.bytes_per_s, burst)

    def wait(self, size: int, *, now: float) -> float:
        """Seconds until a frame of ``size`` bytes fits both budgets (0: now); nothing is counted."""
        wait = self.messages.wait(1.0, now=now)
        if self.bytes is not None:
            wait = max(wait, self.bytes.wait(size, now=now))
        return wait

    def take(self, size: int, *, now: float) -> float:
        """Count a frame of ``size`` bytes if it fits now (returns 0), else the seconds to wait (nothing counted)."""
        wait = self.wait(size, now=now)
        if wait == 0:
            self.spend(size, now=now)
        return wait

    def spend(self, size: int, *, now: float) -> None:
        self.messages.spend(1.0, now=now)
        if self.bytes is not None:
            self.bytes.spend(size, now=now)
