"""The staleness-gated consumer on a real Redis stream: whole groups, stale ones dropped and acknowledged,
unacknowledged ones found again after a restart, and a timeout when data does not come."""

from __future__ import annotations

import time

import pytest
import redis

from dataplane import replay
from learner.consumer import StalenessGatedConsumer

from ..groups import entry_ids, stream_fields

JOB = 7


def group_records(group_id: str, versions: list[int]) -> list[dict]:
    return [
        {"job_id": JOB, "lease_id": f"lease-{group_id}", "group_id": group_id, "prompt": "3+4=",
         "prompt_ids": [1, 10, 5, 11, 17], "completion": str(i), "completion_ids": [4 + i, 2],
         "logprobs": [-1.0, -0.5], "reward": float(i % 2), "version": v}
        for i, v in enumerate(versions)
    ]


def append_group(client: redis.Redis, group_id: str, versions: list[int]) -> str:
    """Append one accepted group the way the site does (marketplace/infra/stream.py: field ``data``)."""
    return client.xadd(replay.trajectories_key(JOB), stream_fields(group_records(group_id, versions)))


@pytest.fixture
def learner_client(redis_url):
    """A client like the learner's own: bytes replies, not decoded."""
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def pending(client: redis.Redis) -> int:
    return client.xpending(replay.trajectories_key(JOB), replay.LEARNER_GROUP)["pending"]


def test_groups_are_returned_whole_in_order(learner_client, redis_client) -> None:
    consumer = StalenessGatedConsumer(learner_client, JOB, staleness=2)
    ids = [append_group(redis_client, "g1", [0, 0, 0]), append_group(redis_client, "g2", [0, 0, 0, 0])]

    wait = consumer.next_batch(groups=2, version=0, timeout_s=2.0)

    assert wait is not None
    assert [g.entry_id for g in wait.groups] == ids
    assert [len(g.records) for g in wait.groups] == [3, 4]
    assert {r.group_id for r in wait.groups[0].records} == {"g1"}
    assert [r.completion for r in wait.groups[1].records] == ["0", "1", "2", "3"]
    assert wait.dropped == 0
    assert pending(redis_client) == 2  # delivered, not yet trained


def test_only_the_requested_number_of_groups_is_returned(learner_client, redis_client) -> None:
    consumer = StalenessGatedConsumer(learner_client, JOB, staleness=2)
    ids = [append_group(redis_client, f"g{i}", [0, 0]) for i in range(3)]

    first = consumer.next_batch(groups=2, version=0, timeout_s=2.0)
    second = consumer.next_batch(groups=1, version=0, timeout_s=2.0)

    assert [g.entry_id for g in first.groups] == ids[:2]
    assert [g.entry_id for g in second.groups] == ids[2:]


def test_stale_groups_are_dropped_counted_and_acknowledged(learner_client, redis_client) -> None:
    # learner at v_t = 5 with S = 2: admissible iff v >= 3 (a group is generated under one version)
    consumer = StalenessGatedConsumer(learner_client, JOB, staleness=2)
    append_group(redis_client, "old", [2, 2, 2])
    append_group(redis_client, "older", [1, 1])
    edge = append_group(redis_client, "edge", [3, 3])
    fresh = append_group(redis_client, "fresh", [5, 5])

    wait = consumer.next_batch(groups=2, version=5, timeout_s=2.0)

    assert [g.entry_id for g in wait.groups] == [edge, fresh]
    assert wait.dropped == 5  # 3 + 2 records
    assert consumer.dropped_total == 5
    key = replay.trajectories_key(JOB)
    assert pending(redis_client) == 2  # only the two returned groups await their training step
    assert entry_ids(redis_client, key) == [edge, fresh]  # dropped entries acknowledged and gone


def test_buffered_group_that_turns_stale_is_dropped(learner_client, redis_client) -> None:
    consumer = StalenessGatedConsumer(learner_client, JOB, staleness=2)
    append_group(redis_client, "early", [0, 0])
    assert consumer.next_batch(groups=2, version=0, timeout_s=0.2) is None  # "early" is buffered

    later = append_group(redis_client, "later", [3, 3])
    append_group(redis_client, "latest", [3, 3])
    wait = consumer.next_batch(groups=2, version=3, timeout_s=2.0)  # now v >= 1 is needed

    assert wait.dropped == 2
    assert consumer.dropped_total == 2
    assert wait.groups[0].entry_id == later
    assert redis_client.xlen(replay.trajectories_key(JOB)) == 2


def test_acknowledged_groups_are_deleted(learner_client, redis_client) -> None:
    consumer = StalenessGatedConsumer(learner_client, JOB, staleness=2)
    append_group(redis_client, "g1", [0, 0])
    append_group(redis_client, "g2", [0, 0])

    wait = consumer.next_batch(groups=2, version=0, timeout_s=2.0)
    consumer.ack(wait.groups)

    assert pending(redis_client) == 0
    assert redis_client.xlen(replay.trajectories_key(JOB)) == 0


def test_restart_finds_unacknowledged_groups_but_not_acknowledged_ones(learner_client, redis_client) -> None:
    before = StalenessGatedConsumer(learner_client, JOB, staleness=2, consumer="learner-0")
    trained = append_group(redis_client, "trained", [0, 0])
    lost = append_group(redis_client, "lost", [0, 0, 0])
    wait = before.next_batch(groups=2, version=0, timeout_s=2.0)
    before.ack([g for g in wait.groups if g.entry_id == trained])
    del before  # the learner crashed before its next step

    after = StalenessGatedConsumer(learner_client, JOB, staleness=2, consumer="learner-0")
    again = after.next_batch(groups=1, version=1, timeout_s=2.0)

    assert [g.entry_id for g in again.groups] == [lost]
    assert len(again.groups[0].records) == 3
    assert after.next_batch(groups=1, version=1, timeout_s=0.3) is None


def test_restart_reads_pending_groups_before_new_ones(learner_client, redis_client) -> None:
    before = StalenessGatedConsumer(learner_client, JOB, staleness=2)
    lost = append_group(redis_client, "lost", [0, 0])
    before.next_batch(groups=1, version=0, timeout_s=2.0)
    new = append_group(redis_client, "new", [0, 0])

    after = StalenessGatedConsumer(learner_client, JOB, staleness=2)
    wait = after.next_batch(groups=2, version=0, timeout_s=2.0)

    assert [g.entry_id for g in wait.groups] == [lost, new]


def test_another_consumer_name_does_not_take_pending_groups(learner_client, redis_client) -> None:
    StalenessGatedConsumer(learner_client, JOB, staleness=2, consumer="learner-0")
    append_group(redis_client, "g1", [0, 0])
    StalenessGatedConsumer(learner_client, JOB, staleness=2, consumer="learner-0").next_batch(
        groups=1, version=0, timeout_s=2.0)

    other = StalenessGatedConsumer(learner_client, JOB, staleness=2, consumer="learner-1")

    assert other.next_batch(groups=1, version=0, timeout_s=0.3) is None


def test_next_batch_times_out_with_too_little_data(learner_client, redis_client) -> None:
    consumer = StalenessGatedConsumer(learner_client, JOB, staleness=2)
    first = append_group(redis_client, "g1", [0, 0])

    started = time.monotonic()
    assert consumer.next_batch(groups=2, version=0, timeout_s=0.5) is None
    elapsed = time.monotonic() - started

    assert 0.45 <= elapsed < 2.0
    # the group read while waiting is kept, not lost: it comes with the next one
    second = append_group(redis_client, "g2", [0, 0])
    wait = consumer.next_batch(groups=2, version=0, timeout_s=2.0)
    assert [g.entry_id for g in wait.groups] == [first, second]


def test_next_batch_on_an_empty_stream_times_out(learner_client) -> None:
    consumer = StalenessGatedConsumer(learner_client, JOB, staleness=2)

    assert consumer.next_batch(groups=1, version=0, timeout_s=0.2) is None


def test_drops_during_a_wait_that_timed_out_are_reported_with_the_next_batch(learner_client, redis_client) -> None:
    consumer = StalenessGatedConsumer(learner_client, JOB, staleness=2)
    append_group(redis_client, "old", [0, 0, 0])  # v_t = 5, S = 2: stale

    assert consumer.next_batch(groups=1, version=5, timeout_s=0.3) is None
    assert consumer.dropped_total == 3
    fresh = append_group(redis_client, "fresh", [5, 5])
    wait = consumer.next_batch(groups=1, version=5, timeout_s=2.0)

    assert [g.entry_id for g in wait.groups] == [fresh]
    assert wait.dropped == 3  # counted in the step that ended the wait, not lost with the timed-out one
    assert consumer.next_batch(groups=1, version=5, timeout_s=0.2) is None
    append_group(redis_client, "next", [5, 5])
    assert consumer.next_batch(groups=1, version=5, timeout_s=2.0).dropped == 0


def test_the_wait_calls_back_so_prompts_are_topped_up_while_stale_groups_are_dropped(learner_client,
                                                                                     redis_client) -> None:
    consumer = StalenessGatedConsumer(learner_client, JOB, staleness=2)
    polls = []
    append_group(redis_client, "old", [0, 0])  # stale at v_t = 5: dropped, which frees backlog mid-wait

    assert consumer.next_batch(groups=1, version=5, timeout_s=1.5, on_poll=lambda: polls.append(1)) is None
    assert len(polls) >= 1  # the learner's top-up runs within the wait, not only before the next one


def test_prompts_are_topped_up_before_the_batch_is_read(learner_client, redis_client) -> None:
    """A read can take long (its audits): the room the last step freed is refilled first, so workers generate the
    batch after next meanwhile."""
    events: list[str] = []
    consumer = StalenessGatedConsumer(learner_client, JOB, staleness=2, on_read=lambda g: events.append("read"))
    append_group(redis_client, "g", [3, 3])
    batch = consumer.next_batch(groups=1, version=3, timeout_s=2.0, on_poll=lambda: events.append("poll"))
    assert batch is not None and [g.records[0].group_id for g in batch.groups] == ["g"]
    assert events[:2] == ["poll", "read"]


def test_the_read_ahead_takes_groups_that_arrive_while_the_batch_trains(learner_client, redis_client) -> None:
    import threading

    readers: list[str] = []
    consumer = StalenessGatedConsumer(learner_client, JOB, staleness=2, prefetch=True,
                                      on_read=lambda g: readers.extend(threading.current_thread().name for _ in g))
    try:
        append_group(redis_client, "first", [3, 3])
        assert consumer.next_batch(groups=1, version=3, timeout_s=2.0) is not None  # a read ahead starts, empty
        time.sleep(0.5)  # "first" trains; only then does the next group come
        append_group(redis_client, "second", [3, 3])
        deadline = time.monotonic() + 5.0
        while len(readers) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert readers[1].startswith("echo2-prefetch")  # read (and audited) on the reader's thread, not the wait
        batch = consumer.next_batch(groups=1, version=4, timeout_s=2.0)
        assert batch is not None and [g.records[0].group_id for g in batch.groups] == ["second"]
    finally:
        consumer.close()
