"""Group re-joins of a fleet that joined together: spread over time per socket, and those that still meet at one
publication written together on one Redis connection (not one connection each: "max number of clients reached")."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis

from marketplace.realtime.channel_layer import ResilientRedisChannelLayer
from marketplace.services import fanout

from ..private_redis import PrivateRedis

SOCKETS = 300


@pytest.fixture
def server(tmp_path):
    server = PrivateRedis(tmp_path, aof=False).start()
    yield server
    server.stop()


def _clients(client: redis.Redis) -> int:
    return int(client.info("clients")["connected_clients"])


async def test_sockets_due_at_once_rejoin_on_a_bounded_number_of_connections(server):
    layer = ResilientRedisChannelLayer(hosts=[server.url], prefix="rejoins")
    group = fanout.agents_group(7)
    followers = [fanout.JobFollower(layer, await layer.new_channel(), worker) for worker in range(SOCKETS)]
    for follower in followers:  # joined one after another: one connection
        await follower.follow({"type": "assign", "job_id": 7, "base": None, "snapshot": None})
    probe = redis.Redis.from_url(server.url)
    key = layer._group_key(group)
    probe.delete(key)  # the memberships expired (group_expiry): only the re-joins bring them back
    before = _clients(probe)
    for follower in followers:
        follower.joined_at = time.monotonic() - 2 * fanout.REJOIN_AFTER_S  # all due at one publication
    await asyncio.wait_for(asyncio.gather(*(follower.stay() for follower in followers)), 30)
    assert _clients(probe) - before <= 2  # the old way opened one connection per socket due
    assert probe.zcard(key) == SOCKETS
    assert all(time.monotonic() - f.joined_at < 30 for f in followers)  # each renewed, not due again
    await layer.group_send(group, {"type": "probe"})
    received = await asyncio.wait_for(layer.receive(followers[-1].channel_name), 5)
    assert received["type"] == "probe"
    probe.close()
    await layer.flush()


def test_rejoin_times_spread_over_half_the_hour():
    followers = [fanout.JobFollower(None, f"c{i}", i) for i in range(1000)]
    due_after = sorted(fanout.REJOIN_AFTER_S * f.spread for f in followers)
    assert due_after[0] >= fanout.REJOIN_AFTER_S / 2 and due_after[-1] <= fanout.REJOIN_AFTER_S
    # no minute of the half hour holds more than a small share of the fleet (uniform: ~33 of 1,000)
    per_minute = [sum(1 for d in due_after if m * 60 <= d < (m + 1) * 60) for m in range(30, 60)]
    assert max(per_minute) < 100
