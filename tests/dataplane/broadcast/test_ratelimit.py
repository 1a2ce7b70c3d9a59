"""The token bucket that emulates wide-area links: it holds its rate, alone or shared by two streams."""

from __future__ import annotations

import asyncio
import time

import pytest

from dataplane.broadcast.ratelimit import PIECE_BYTES, TokenBucket, bucket


async def test_token_bucket_holds_the_rate_within_generous_bounds():
    rate = 2_000_000
    bucket = TokenBucket(rate, burst=64_000)
    start = time.monotonic()
    for _ in range(16):
        await bucket.acquire(64_000)  # 1.024 MB: the first 64 kB is the burst, the rest takes ~0.48 s
    elapsed = time.monotonic() - start
    assert 0.35 < elapsed < 1.5


async def test_token_bucket_shared_by_two_streams_splits_the_rate():
    bucket = TokenBucket(2_000_000, burst=32_000)
    done: dict[str, float] = {}

    async def stream(name: str) -> None:
        for _ in range(16):
            await bucket.acquire(32_000)
        done[name] = time.monotonic()

    start = time.monotonic()
    await asyncio.gather(stream("a"), stream("b"))
    # 1.024 MB in total through one 2 MB/s bucket: both finish together, after ~0.5 s, not after ~0.25 s.
    assert all(0.35 < t - start < 1.5 for t in done.values())
    assert abs(done["a"] - done["b"]) < 0.2


def test_token_bucket_rejects_nonsense():
    with pytest.raises(ValueError):
        TokenBucket(0, burst=10)
    assert bucket(None) is None
    assert bucket(1e6).burst == PIECE_BYTES == 64 << 10
