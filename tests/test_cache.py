"""The site's Redis cache (throttles, lockouts, hello limits): one client per process, whatever the async context."""

from __future__ import annotations

import asyncio
import os

import redis
from asgiref.sync import sync_to_async
from django.core.cache import cache, caches


def test_every_async_context_shares_one_redis_client_and_its_connections(settings, redis_url):
    settings.CACHES = {"default": {"BACKEND": "echo2_site.cache.RedisCache", "LOCATION": redis_url}}
    server = redis.Redis.from_url(redis_url)
    before = len(server.client_list())

    def counted(i: int) -> tuple[int, int]:
        cache.set(f"k{i}", i)
        assert cache.get(f"k{i}") == i
        return id(caches["default"]), id(caches["default"]._cache)

    async def sockets() -> list[tuple[int, int]]:  # as many agent sockets' tasks, each an async context
        return await asyncio.gather(*(asyncio.create_task(sync_to_async(counted, thread_sensitive=False)(i))
                                      for i in range(40)))

    seen = asyncio.run(sockets())
    assert len({backend for backend, _ in seen}) > 1  # Django's backends are per context, as ever
    assert len({client for _, client in seen}) == 1  # Django's own client was one per backend: 40 clients
    threads = min(32, (os.cpu_count() or 1) + 4)  # the default executor's, which runs the calls
    assert len(server.client_list()) - before <= threads  # its pool's connections, at most one a thread
    cache.clear()
