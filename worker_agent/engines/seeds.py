"""Sampling seeds that never overlap: one disjoint block of seeds per request.

vLLM seeds sample ``i`` of a request with ``seed + i`` (``vllm/v1/engine/parallel_sampling.py``), so a request for
``n`` samples uses the block ``[seed, seed + n)``. Per-call seeds one apart (``seed * K + call``) made sample ``j``
of call ``k`` share its noise with sample ``j - 1`` of call ``k + 1``, and one seed for every prompt of a call gave
the prompts the same noise. :class:`SeedStream` hands out consecutive, disjoint blocks instead: one per request,
``n`` seeds long, from a start derived by hashing the engine's seed, so that engines started with seeds 0, 1, 2...
(the workers of a job) draw from streams 2**61 apart on average instead of overlapping ones.
"""

from __future__ import annotations

import hashlib

SEED_SPACE = 2**63  # seeds stay non-negative int64 (vLLM passes them to torch.Generator.manual_seed)
_START_SPACE = 2**62  # where a stream starts; leaves 2**62 seeds of room before SEED_SPACE


def stream_start(seed: int) -> int:
    """Where the stream of ``seed`` starts: a hash of it, below 2**62."""
    digest = hashlib.sha256(f"echo2-sampling-seed:{seed}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % _START_SPACE


class SeedStream:
    """Disjoint blocks of seeds from one engine seed: ``take(n)`` returns ``s``, and ``[s, s + n)`` is never handed
    out again by this stream."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.next = stream_start(seed)

    def take(self, count: int) -> int:
        if count < 1:
            raise ValueError(f"a block of seeds needs count >= 1, got {count}")
        start = self.next
        if start + count > SEED_SPACE:  # after 2**62 seeds: some 10**10 years of sampling
            raise OverflowError("the seed stream is exhausted")
        self.next = start + count
        return start
