"""An agent paced by the budget its site announces is never refused, however fast it could go: the
frames' send times, replayed through the site's own bucket (``marketplace.infra.limits.MessageBucket``), all pass."""

from __future__ import annotations

import asyncio
import time

from dataplane import messages as m
from marketplace.infra.limits import MessageBucket
from worker_agent.pacing import Pacer
from worker_agent.rollout_loop import batch_size


def send_times(pacer: Pacer, sizes: list[int]) -> list[float]:
    async def flood() -> list[float]:
        stamps = []
        for size in sizes:  # as fast as the pacer lets it: the fastest agent there is
            await pacer.wait(size)
            stamps.append(time.monotonic())
        return stamps

    return asyncio.run(flood())


def test_frames_sent_as_fast_as_the_pacer_allows_all_pass_the_sites_bucket():
    site = MessageBucket(rate=200.0, burst=10.0, close_after=5)
    pacer = Pacer()
    pacer.configure(messages_per_s=site.rate, message_burst=site.burst, bytes_per_s=None, max_frame=1 << 20)
    stamps = send_times(pacer, [100] * 120)
    refused = [i for i, at in enumerate(stamps) if site.take(100, now=at)]
    assert refused == []
    assert stamps[-1] - stamps[0] >= (120 - 10) / 200  # paced: not faster than the site's rate


def test_big_frames_are_paced_by_the_byte_budget_too():
    site = MessageBucket(rate=1000.0, burst=100.0, close_after=5, bytes_per_s=400_000.0, max_frame=50_000)
    pacer = Pacer()
    pacer.configure(messages_per_s=site.rate, message_burst=site.burst, bytes_per_s=site.bytes_per_s, max_frame=50_000)
    stamps = send_times(pacer, [50_000] * 12)
    assert [i for i, at in enumerate(stamps) if site.take(50_000, now=at)] == []
    assert stamps[-1] - stamps[0] >= (12 * 50_000 - 2 * 50_000) / 400_000 * 0.9


def test_a_refusal_holds_every_send_for_its_retry_after():
    pacer = Pacer()
    pacer.hold(0.3)
    started = time.monotonic()
    send_times(pacer, [10])
    assert time.monotonic() - started >= 0.29


def test_a_new_connection_starts_with_a_small_burst_not_the_sites_whole_one():
    """A fleet reconnecting together must not spend the site's full burst at once: one second of the paced rate."""
    pacer = Pacer()
    pacer.configure(messages_per_s=50.0, message_burst=200.0, bytes_per_s=None, max_frame=1 << 20)
    stamps = send_times(pacer, [10] * 60)
    at_once = sum(1 for at in stamps if at - stamps[0] < 0.05)
    assert at_once <= 42  # 0.8 x 50 per second, plus what refills in 50 ms


def test_batches_grow_when_one_round_trip_per_batch_would_use_the_budget():
    assert batch_size(least=2, groups_per_s=None, messages_per_s=40.0) == 2  # nothing measured yet
    assert batch_size(least=2, groups_per_s=5.0, messages_per_s=40.0) == 2  # slow: the least
    assert batch_size(least=2, groups_per_s=100.0, messages_per_s=40.0) == 10  # 10 groups a message: 10 msg/s
    assert batch_size(least=2, groups_per_s=1e6, messages_per_s=40.0) == m.MAX_BATCH
