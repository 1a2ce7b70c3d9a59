"""Token-bucket rate caps on a link: the learner uplink ``B0``, a worker's ``Bw`` (paper section 4.2).

The framing code acquires tokens for every piece of :data:`PIECE_BYTES` it writes or reads, so links sharing
one bucket interleave fairly and a wide-area network can be emulated on one machine. Bandwidth is in bytes
per second.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

PIECE_BYTES = 64 << 10
"""Payloads are written and rate-limited in pieces this big, so links sharing one bucket interleave fairly."""

@dataclass
class TokenBucket:
    """At most ``rate_bps`` bytes per second on average, bursts up to ``burst`` bytes.

    One bucket may be shared by many streams (the learner's ``B0`` across its seeds); waiters are served
    first come, first served, so streams writing equal pieces share the rate evenly.
    """

    rate_bps: float
    burst: float
    _tokens: float = field(init=False)
    _stamp: float = field(init=False)
    _lock: asyncio.Lock = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.rate_bps > 0 or not self.burst > 0:
            raise ValueError(f"TokenBucket needs rate_bps > 0 and burst > 0, got {self.rate_bps}, {self.burst}")
        self._tokens, self._stamp, self._lock = float(self.burst), time.monotonic(), asyncio.Lock()

    async def acquire(self, n: int) -> None:
        """Wait until ``n`` bytes may pass; requests above ``burst`` pass in burst-sized slices."""
        async with self._lock:
            while n > 0:
                take = min(n, self.burst)
                self._refill()
                if self._tokens < take:
                    await asyncio.sleep((take - self._tokens) / self.rate_bps)
                    self._refill()
                self._tokens -= take
                n -= take

    def _refill(self) -> None:
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate_bps)
        self._stamp = now


def bucket(rate_bps: float | None, *, burst: float | None = None) -> TokenBucket | None:
    """A bucket for ``rate_bps`` (None: uncapped); the default burst is 1/20 s of traffic, at least a piece."""
    if rate_bps is None:
        return None
    return TokenBucket(rate_bps, burst if burst is not None else max(PIECE_BYTES, rate_bps / 20))
