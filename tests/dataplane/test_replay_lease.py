"""The replay buffer's one-round-trip lease and return, on a real Redis."""

from __future__ import annotations

import pytest

from dataplane import replay
from dataplane.replay import LeaseError, ReplayBuffer, TimedEvent
from tests.groups import group_of

JOB = 7


def records(lease: replay.LeasedPrompt) -> list[dict]:
    return [{"job_id": JOB, "lease_id": lease.lease_id, "group_id": lease.group_id, "prompt": lease.prompt,
             "prompt_ids": [1, 2], "completion": "4", "completion_ids": [5], "logprobs": [-0.5], "reward": 1.0,
             "version": 0} for _ in range(2)]


@pytest.fixture
def buffer(redis_client) -> ReplayBuffer:
    buffer = ReplayBuffer(redis_client, JOB)
    buffer.ensure_groups()
    return buffer


def test_a_lease_hands_expired_leases_first_then_fresh_prompts(buffer, redis_client):
    buffer.add_prompts(["1+1=", "2+2=", "3+3=", "4+4=", "5+5="])
    old = buffer.lease(worker_id=1, count=2, timeout_s=60)
    assert [p.prompt for p in old] == ["1+1=", "2+2="]
    assert [p.prompt for p in buffer.lease(worker_id=2, count=1, timeout_s=60)] == ["3+3="]  # none expired yet
    buffer.return_leases(worker_id=2)  # handed back: idle for a day, so expired at any timeout
    taken = buffer.lease(worker_id=3, count=3, timeout_s=30)
    assert [p.prompt for p in taken] == ["3+3=", "4+4=", "5+5="]  # the expired lease first, then fresh prompts
    taken = buffer.lease(worker_id=4, count=3, timeout_s=0)  # at 0 s every pending lease has expired
    assert [p.prompt for p in taken] == ["1+1=", "2+2=", "3+3="]
    pending = redis_client.xpending_range(buffer.prompts, replay.PROMPT_GROUP, min="-", max="+", count=10,
                                          consumername=replay.consumer_name(4))
    assert {p["message_id"] for p in pending} == {p.lease_id for p in taken}


def test_a_lease_of_an_empty_stream_is_empty_and_expired_first_even_then(buffer):
    assert buffer.lease(worker_id=1, count=4, timeout_s=30) == []
    buffer.add_prompts(["1+1="])
    (first,) = buffer.lease(worker_id=1, count=4, timeout_s=30)
    (again,) = buffer.lease(worker_id=2, count=4, timeout_s=0)
    assert again == first  # the only prompt, expired at 0 s, handed to worker 2 with its group id and prompt


def test_the_event_is_added_with_an_accepted_group_and_never_with_a_refused_one(buffer, redis_client):
    buffer.add_prompts(["1+1=", "2+2="])
    mine, other = buffer.lease(worker_id=1, count=2, timeout_s=60)
    event = TimedEvent(key="test:events", member="100.0:2:ab", at=100.0, keep_after=50.0, ttl_s=60)
    redis_client.zadd("test:events", {"old": 10.0})
    before = redis_client.time()
    buffer.return_group(worker_id=1, group=group_of(records(mine)), event=event)
    after = redis_client.time()
    (member, at), = redis_client.zrange("test:events", 0, -1, withscores=True)  # "old" trimmed
    # scored at Redis' clock when the group was stored (the clock its idle times are read on), not the caller's
    assert before[0] + before[1] / 1e6 <= at <= after[0] + after[1] / 1e6
    assert member.startswith("100.0:2:ab:")  # and the ms its lease was held
    assert 0 <= int(member.rsplit(":", 1)[1]) < 60_000
    assert 0 < redis_client.ttl("test:events") <= 60
    late = TimedEvent(key="test:events", member="200.0:2:cd", at=200.0, keep_after=150.0, ttl_s=60)
    with pytest.raises(LeaseError, match="another worker"):
        buffer.return_group(worker_id=2, group=group_of(records(other)), event=late)
    assert [m.rsplit(":", 1)[0] for m in redis_client.zrange("test:events", 0, -1)] == ["100.0:2:ab"]
    assert buffer.counters()["accepted_records"] == 2


def test_acknowledging_with_a_count_counts_each_entry_once_however_often_it_is_retried(buffer, redis_client):
    ids = [redis_client.xadd(buffer.trajectories, {"data": b"x"}) for _ in range(3)]
    buffer.read("learner-0", count=3, block_ms=1)  # pending, as groups read and not trained are
    assert buffer.ack_counted([(ids[0], 8), (ids[1], 4)], replay.DROPPED_STALE) == 12
    # a retry after a lost reply, with one entry more: only the new one counts
    assert buffer.ack_counted([(ids[0], 8), (ids[1], 4), (ids[2], 8)], replay.DROPPED_STALE) == 8
    assert buffer.ack_counted([], replay.DROPPED_STALE) == 0
    assert buffer.counters()[replay.DROPPED_STALE] == 20
    assert redis_client.xlen(buffer.trajectories) == 0  # deleted: the stream is a queue
    assert redis_client.xpending(buffer.trajectories, replay.LEARNER_GROUP)["pending"] == 0


def test_a_group_returned_again_by_its_worker_is_the_stored_entry_not_a_refusal_nor_a_second_entry(buffer,
                                                                                                   redis_client):
    """A resend (the reply was lost; the agent reconnected) finds the lease answered and gone: it gets the entry its
    first return stored, appended once, counted as resent; another worker's or another group's is still refused."""
    buffer.add_prompts(["1+1=", "2+2="])
    mine, other = buffer.lease(worker_id=1, count=2, timeout_s=60)
    group = group_of(records(mine))
    first = buffer.return_group(worker_id=1, group=group)
    again = buffer.return_group(worker_id=1, group=group)
    assert again == first and again.resent and not first.resent
    assert redis_client.xlen(buffer.trajectories) == 1
    counters = buffer.counters()
    assert (counters["accepted_groups"], counters["resent_groups"]) == (1, 1)
    assert 0 < redis_client.ttl(replay.returned_key(JOB, mine.lease_id)) <= replay.RESEND_MEMORY_S
    with pytest.raises(LeaseError, match="expired"):
        buffer.return_group(worker_id=2, group=group)  # not the worker that answered it
    renamed = group_of([{**r, "group_id": "other"} for r in records(mine)])
    with pytest.raises(LeaseError, match="expired"):
        buffer.return_group(worker_id=1, group=renamed)


def test_a_renewal_restarts_the_timeout_of_the_workers_live_leases_and_leaves_expired_ones(buffer, redis_client):
    """A worker that just returned a group is visibly working: its other leases start their timeout again, so a
    lease taken ahead is not handed to another worker while it delivers under load; one already expired is not
    taken back from whoever may be claiming it."""
    buffer.add_prompts(["1+1=", "2+2=", "3+3="])
    live, late, _ = buffer.lease(worker_id=1, count=3, timeout_s=10)
    redis_client.xclaim(buffer.prompts, replay.PROMPT_GROUP, replay.consumer_name(1), 0, [live.lease_id],
                        idle=8_000, justid=True)  # 8 s into its 10 s
    redis_client.xclaim(buffer.prompts, replay.PROMPT_GROUP, replay.consumer_name(1), 0, [late.lease_id],
                        idle=12_000, justid=True)  # expired
    assert buffer.renew(worker_id=1, timeout_s=10) == 2  # the fresh one and the one 8 s in
    idle = {p["message_id"]: p["time_since_delivered"] for p in redis_client.xpending_range(
        buffer.prompts, replay.PROMPT_GROUP, min="-", max="+", count=10, consumername=replay.consumer_name(1))}
    assert idle[live.lease_id] < 1_000 and idle[late.lease_id] >= 12_000
    assert [p.lease_id for p in buffer.lease(worker_id=2, count=3, timeout_s=10)] == [late.lease_id]
    assert buffer.renew(worker_id=3, timeout_s=10) == 0  # no leases: nothing
