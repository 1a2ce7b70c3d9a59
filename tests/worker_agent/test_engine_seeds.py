"""Seed blocks never overlap: no two samples, of one call or of different calls, share their sampling noise."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from worker_agent.engines.seeds import SEED_SPACE, SeedStream, stream_start


@given(seed=st.integers(min_value=-(2**70), max_value=2**70),
       blocks=st.lists(st.integers(min_value=1, max_value=4096), min_size=1, max_size=60))
def test_blocks_of_one_stream_are_disjoint_and_in_range(seed: int, blocks: list[int]) -> None:
    stream = SeedStream(seed)
    taken = [(stream.take(n), n) for n in blocks]

    seeds = [start + i for start, n in taken for i in range(n)]  # vLLM seeds sample i of a request start + i
    assert len(set(seeds)) == len(seeds)
    assert all(0 <= s < SEED_SPACE for s in seeds)


@given(seeds=st.lists(st.integers(min_value=0, max_value=10**6), min_size=2, max_size=8, unique=True))
def test_streams_of_different_seeds_start_far_apart(seeds: list[int]) -> None:
    starts = sorted(stream_start(s) for s in seeds)

    assert all(b - a > 10**12 for a, b in zip(starts, starts[1:], strict=False))  # ~2**61 apart, not 1


def test_the_same_seed_gives_the_same_blocks() -> None:
    a, b = SeedStream(7), SeedStream(7)

    assert [a.take(3), a.take(5)] == [b.take(3), b.take(5)]


def test_consecutive_calls_do_not_shift_into_each_other() -> None:
    """The old scheme (seed * 1_000_003 + call, sample i at + i) gave call k's sample j the seed of call k + 1's
    sample j - 1; blocks of n do not."""
    stream = SeedStream(0)
    first, second = stream.take(4), stream.take(4)

    assert second == first + 4


def test_an_empty_block_is_refused() -> None:
    with pytest.raises(ValueError, match="count >= 1"):
        SeedStream(0).take(0)
