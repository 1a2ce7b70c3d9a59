"""The site's channel layer rides out a Redis restart: a waiting consumer is not crashed (channels_redis' own
layer raises out of ``receive`` and Channels closes every agent socket with 1011), and the groups it joined
are joined again when the restarted Redis lost them."""

from __future__ import annotations

import asyncio

import pytest

from marketplace.realtime.channel_layer import ResilientRedisChannelLayer
from tests.private_redis import PrivateRedis


async def send_until_received(sender, group: str, waiting: asyncio.Future) -> None:
    """Push to ``group`` until the waiting receive has it: the receiver's layer joins its groups again once Redis is
    back (without persistence they are gone), and what was pushed before that reached nobody."""
    for _ in range(100):
        await sender.group_send(group, {"type": "agent.message", "n": 1})
        done, _ = await asyncio.wait({waiting}, timeout=0.1)
        if done:
            break
    assert waiting.result() == {"type": "agent.message", "n": 1}


class ReadCounter:
    """The reads from Redis that ``layer``'s reader of the process's channel makes, counted (``n``)."""

    def __init__(self, layer: ResilientRedisChannelLayer) -> None:
        self.n, real = 0, layer.receive_local

        async def counted(channel, delivered):
            self.n += 1
            return await real(channel, delivered)

        layer.receive_local = counted


@pytest.mark.parametrize("aof", [True, False], ids=["aof", "no-persistence"])
async def test_a_waiting_receive_survives_a_redis_restart(tmp_path, aof) -> None:
    server = PrivateRedis(tmp_path, aof=aof).start()
    try:
        layer = ResilientRedisChannelLayer(hosts=[server.url], prefix="t")
        sender = ResilientRedisChannelLayer(hosts=[server.url], prefix="t")
        channel = await layer.new_channel()
        await layer.group_add("worker.1", channel)
        waiting = asyncio.ensure_future(layer.receive(channel))
        await asyncio.sleep(0.3)  # blocked inside channels_redis' receive

        await asyncio.to_thread(server.kill)
        await asyncio.sleep(0.5)
        assert not waiting.done()  # with channels_redis' layer this raised ConnectionError
        await asyncio.to_thread(server.start)

        await send_until_received(sender, "worker.1", waiting)
        await layer.group_discard("worker.1", channel)
        assert channel not in layer.memberships
        await layer.flush()
        await sender.close_pools()
        await layer.close_pools()
    finally:
        server.stop()


async def test_one_read_tells_every_socket_of_the_process(tmp_path) -> None:
    """A group message for 300 of the process's channels is read from Redis once and handed to each channel's queue:
    the waiting receives get it, a channel between two receives finds it at its next, and once no receive waits the
    reader stops and a closed socket's queue is gone."""
    server = PrivateRedis(tmp_path, aof=False).start()
    try:
        layer = ResilientRedisChannelLayer(hosts=[server.url], prefix="t")
        reads = ReadCounter(layer)
        channels = [await layer.new_channel() for _ in range(301)]
        await layer.group_add_many("agents.job.1", channels)
        late, channels = channels[0], channels[1:]
        waiting = [asyncio.ensure_future(layer.receive(c)) for c in channels]
        await asyncio.sleep(0.2)
        await layer.group_send("agents.job.1", {"type": "agent.snapshot", "version": 3})
        done, _ = await asyncio.wait(waiting, timeout=5)
        assert len(done) == len(channels)
        assert {tuple(t.result().items()) for t in done} == {(("type", "agent.snapshot"), ("version", 3))}
        assert reads.n == 2  # the message, then the next read waiting (cancelled below)
        assert await asyncio.wait_for(layer.receive(late), 1) == {"type": "agent.snapshot", "version": 3}

        closing = asyncio.ensure_future(layer.receive(channels[0]))
        await asyncio.sleep(0.1)
        closing.cancel()
        await asyncio.sleep(0.05)
        assert layer._reader.task is None and not layer._reader.waiting
        assert layer.local_queues == {}
        await layer.flush()
    finally:
        server.stop()


async def test_the_reader_takes_what_waits_in_batches_and_a_batch_cut_short_is_read_again(tmp_path) -> None:
    """600 messages for 600 of the process's sockets, sent one by one (as a job's assignments are), reach every socket
    in a few reads rather than one read each; a batch taken and never handed on is read again, one handed on never."""
    server = PrivateRedis(tmp_path, aof=False).start()
    try:
        # every socket of a process shares its channel, and so its capacity (the site's is 100,000)
        layer = ResilientRedisChannelLayer(hosts=[server.url], prefix="t", capacity=1000)
        sender = ResilientRedisChannelLayer(hosts=[server.url], prefix="t", capacity=1000)
        channels = [await layer.new_channel() for _ in range(600)]
        for i, channel in enumerate(channels):
            await sender.send(channel, {"type": "agent.message", "n": i})
        reads = ReadCounter(layer)
        got = await asyncio.wait_for(asyncio.gather(*(layer.receive(c) for c in channels)), 10)
        assert [message["n"] for message in got] == list(range(600))
        assert reads.n <= 4  # 256 + 256 + 88, then one waiting (or cut short once all were received)
        await asyncio.sleep(0.05)  # no receive waits: the reader stops, so what is sent next waits for the calls below
        assert layer._reader.task is None

        process = layer.non_local_name(channels[0])
        await sender.send(channels[0], {"type": "agent.message", "n": "a"})
        await sender.send(channels[1], {"type": "agent.message", "n": "b"})
        raw, taken = await layer.receive_local(process, layer.local_delivered)  # taken, then the reader "cancelled"
        assert [m["n"] for _, m in taken] == ["a", "b"]
        raw_again, again = await layer.receive_local(process, [])  # nothing said handed on: both read again, in order
        assert [m["n"] for _, m in again] == ["a", "b"] and raw_again == raw
        await sender.send(channels[2], {"type": "agent.message", "n": "c"})
        _, after = await layer.receive_local(process, raw_again)  # handed on: forgotten, never read a third time
        assert [(named, m["n"]) for named, m in after] == [(channels[2], "c")]
        await layer.flush()
        await sender.close_pools()
        await layer.close_pools()
    finally:
        server.stop()


async def test_every_channel_of_the_process_joins_again_after_a_restart_that_lost_the_groups(tmp_path) -> None:
    """Two sockets in a group, one of them between receives while Redis restarts without persistence: the reader
    joins both again, so both have the next message."""
    server = PrivateRedis(tmp_path, aof=False).start()
    try:
        layer = ResilientRedisChannelLayer(hosts=[server.url], prefix="t")
        sender = ResilientRedisChannelLayer(hosts=[server.url], prefix="t")
        reading, between = await layer.new_channel(), await layer.new_channel()
        await layer.group_add("agents.job.1", reading)
        await layer.group_add("agents.job.1", between)
        waiting = asyncio.ensure_future(layer.receive(reading))
        await asyncio.sleep(0.3)
        await asyncio.to_thread(server.kill)
        await asyncio.sleep(0.5)
        await asyncio.to_thread(server.start)
        await send_until_received(sender, "agents.job.1", waiting)
        assert await asyncio.wait_for(layer.receive(between), 1) == {"type": "agent.message", "n": 1}
        await layer.flush()
        await sender.close_pools()
    finally:
        server.stop()


async def test_leaving_a_group_while_redis_is_away_is_not_an_error(tmp_path) -> None:
    server = PrivateRedis(tmp_path).start()
    try:
        layer = ResilientRedisChannelLayer(hosts=[server.url], prefix="t")
        channel = await layer.new_channel()
        await layer.group_add("worker.1", channel)
        await asyncio.to_thread(server.kill)
        await layer.group_discard("worker.1", channel)  # a socket closing during the outage
        assert channel not in layer.memberships
        await layer.close_pools()
    finally:
        server.stop()


def _drop_broker_pool(app) -> None:
    """Forget the connection and producer pools: the next publish builds them for the broker URL set now."""
    app._pool = None
    app.amqp._producer_pool = None


@pytest.mark.django_db(transaction=True)
def test_starting_a_job_while_the_broker_is_away_succeeds_and_logs(settings, caplog, tmp_path) -> None:
    """The job is started (committed) whatever the broker does; the lost enqueue is logged, not a 500."""
    from celery import current_app

    from marketplace import services
    from marketplace.models import Job

    from . import factories

    # Celery reads the Django settings on every lookup: set through the fixture, they are restored after.
    settings.CELERY_BROKER_URL = PrivateRedis(tmp_path).url  # a port nothing listens on
    settings.CELERY_TASK_ALWAYS_EAGER = False
    _drop_broker_pool(current_app)
    try:
        job = factories.job(factories.user())
        services.job_start(job=job)
    finally:
        _drop_broker_pool(current_app)
    assert Job.objects.get(pk=job.pk).status == Job.Status.RUNNING
    assert "marketplace.tasks.replan_job" in caplog.text and "not enqueued" in caplog.text
