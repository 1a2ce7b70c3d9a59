"""The site's channel layer rides out a Redis restart: a waiting consumer is not crashed (channels_redis' own
layer raises out of ``receive`` and Channels closes every agent socket with 1011), and the groups it joined
are joined again when the restarted Redis lost them."""

from __future__ import annotations

import asyncio

import pytest

from marketplace.realtime.channel_layer import ResilientRedisChannelLayer
from tests.private_redis import PrivateRedis


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

        # Keep pushing until the receiver has re-joined its group (without persistence the group is gone).
        for _ in range(100):
            await sender.group_send("worker.1", {"type": "agent.message", "n": 1})
            done, _ = await asyncio.wait({waiting}, timeout=0.1)
            if done:
                break
        assert waiting.result() == {"type": "agent.message", "n": 1}
        await layer.group_discard("worker.1", channel)
        assert channel not in layer.memberships
        await layer.flush()
        await sender.close_pools()
        await layer.close_pools()
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
