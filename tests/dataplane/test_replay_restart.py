"""The replay buffer rides out a Redis restart: a private redis-server (AOF, everysec) is SIGKILLed under a
reading learner and a leasing site and started again on the same port one second later. Every group is
read exactly once and nothing is lost; without persistence the consumer groups come back by themselves."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from dataplane.records import Trajectory, TrajectoryGroup
from dataplane.redis_async import connect_async
from dataplane.replay import ReplayBuffer, connect
from learner.consumer import StalenessGatedConsumer

from ..private_redis import PrivateRedis

JOB = 3


def group(i: int) -> str:
    records = [Trajectory(job_id=JOB, lease_id=f"{i}-0", group_id=f"g{i}", prompt="1+1=", prompt_ids=[1, 2],
                          completion="2", completion_ids=[3], logprobs=[-0.5], reward=1.0, version=0)] * 2
    return TrajectoryGroup.of(records).model_dump_json()


@pytest.fixture
def private_redis(tmp_path):
    server = PrivateRedis(tmp_path).start()
    yield server
    server.stop()


def test_a_reader_loses_nothing_and_reads_nothing_twice_across_a_restart(private_redis) -> None:
    writer = connect(private_redis.url, socket_timeout=2)
    reader = StalenessGatedConsumer(connect(private_redis.url, decode_responses=False, socket_timeout=2), JOB,
                                    staleness=5, retry_for_s=30.0)
    total, seen, half_read = 40, [], threading.Event()

    def produce() -> None:
        buffer = ReplayBuffer(writer, JOB, retry_for_s=30.0)
        for i in range(total):
            if i == total // 2:  # pause: the reader blocks in XREADGROUP, and Redis dies under it
                half_read.wait(30)
                time.sleep(0.5)
                private_redis.kill()
                time.sleep(1.0)
                private_redis.start()
            buffer._retrying(lambda i=i: writer.xadd(f"echo2:job:{JOB}:trajectories",
                                                     {"lease_id": f"{i}-0", "data": group(i)}))
            time.sleep(0.02)

    producer = threading.Thread(target=produce)
    producer.start()
    while len(seen) < total:
        batch = reader.next_batch(groups=1, version=0, timeout_s=20.0)
        assert batch is not None, f"no data after {len(seen)} groups"
        seen.extend(g.group.group_id for g in batch.groups)
        reader.ack(batch.groups)
        if len(seen) == total // 2:
            half_read.set()
    producer.join(30)
    assert seen == [f"g{i}" for i in range(total)]  # each once, in order, none lost
    assert reader.replay.reconnects >= 1  # the blocked read saw the restart and came back


def test_without_persistence_the_groups_are_created_again(tmp_path) -> None:
    server = PrivateRedis(tmp_path, aof=False).start()
    try:
        client = connect(server.url, socket_timeout=2)
        buffer = ReplayBuffer(client, JOB, retry_for_s=30.0)
        buffer.ensure_groups()
        buffer.add_prompts(["1+1="])
        server.kill()
        server.start()  # empty: streams and consumer groups are gone
        assert buffer.lease(worker_id=1, count=1, timeout_s=30.0) == []  # no NOGROUP error: groups re-created
        buffer.add_prompts(["2+2="])
        assert [p.prompt for p in buffer.lease(worker_id=1, count=1, timeout_s=30.0)] == ["2+2="]
    finally:
        server.stop()


def submit_request(*, lease: int) -> dict:
    """A lease request as ``ReplayBuffer.submit`` takes it: no groups, ``lease`` prompts wanted."""
    return dict(worker_id=1, groups=[], lease=lease, timeout_s=30.0, renew=False, now=time.time(),
                observed_key="echo2:test:observed", observed_ttl_s=60)


def test_a_submit_on_the_event_loop_rides_a_restart_and_creates_the_groups_again(tmp_path) -> None:
    """The loop's twin of the sync retries: connection errors are waited out (without holding the loop) and a
    restart that lost the consumer groups has them created again, on the loop's own client."""
    server = PrivateRedis(tmp_path, aof=False).start()
    buffer = ReplayBuffer(connect(server.url, socket_timeout=2), JOB, retry_for_s=30.0)

    async def run() -> tuple[list[str], list[str], int]:
        client = connect_async(server.url, max_connections=2, socket_timeout=2)
        try:
            first = await buffer.submit_async(client, **submit_request(lease=1))
            server.kill()
            back = threading.Timer(1.0, server.start)  # back, empty, while the submit below retries
            back.start()
            ticks = 0

            async def tick() -> None:  # the loop stays free while the submit waits for Redis
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.05)
                    ticks += 1

            ticking = asyncio.create_task(tick())
            during = await buffer.submit_async(client, **submit_request(lease=1))
            ticking.cancel()
            back.join(15)
            buffer.add_prompts(["2+2="])
            after = await buffer.submit_async(client, **submit_request(lease=1))
            return [p.prompt for p in first.leased + during.leased], [p.prompt for p in after.leased], ticks
        finally:
            await client.aclose()

    try:
        buffer.ensure_groups()
        buffer.add_prompts(["1+1="])
        before, after, ticks = asyncio.run(run())
        assert before == ["1+1="]  # the restart lost the stream: nothing to lease during it, and no NOGROUP error
        assert after == ["2+2="]
        assert buffer.reconnects == 1 and ticks >= 10
    finally:
        server.stop()


@pytest.mark.parametrize("where", ["thread", "event loop"])
def test_an_outage_longer_than_the_budget_raises(tmp_path, where: str) -> None:
    server = PrivateRedis(tmp_path).start()
    buffer = ReplayBuffer(connect(server.url, socket_timeout=1), JOB, retry_for_s=1.0)
    buffer.ensure_groups()

    async def on_the_loop() -> None:
        client = connect_async(server.url, max_connections=2, socket_timeout=1)
        try:
            await buffer.submit_async(client, **submit_request(lease=1))  # connected when Redis dies
            server.kill()
            await buffer.submit_async(client, **submit_request(lease=1))
        finally:
            await client.aclose()

    def on_a_thread() -> None:
        server.kill()
        buffer.counters()

    started = time.monotonic()
    try:
        with pytest.raises(Exception, match="(?i)connect"):
            asyncio.run(on_the_loop()) if where == "event loop" else on_a_thread()
    finally:
        server.stop()
    assert 0.9 < time.monotonic() - started < 10
