"""Django's Redis cache with one client per process, not one per async context.

Django keeps a cache backend per asgiref ``Local``, which follows the async context: each agent socket's task (and
each sync call it makes through ``sync_to_async``) got a backend of its own, and with it a connection pool and a
new Redis connection. In a reconnect storm every socket's credential check and hello limit (``infra.limits``) opened
one: opening them was a sixth of a site process's samples in a py-spy of 1,000 agents connecting at once, and
each socket's calls could hold connections of their own.
The client (its pools, which redis-py makes safe across threads and forks) is shared instead, per location and
options; the backend objects stay per context, as Django makes them.
"""

from __future__ import annotations

import threading
from functools import cached_property

from django.core.cache.backends import redis

_CLIENTS: dict[tuple[tuple[str, ...], str], redis.RedisCacheClient] = {}
_LOCK = threading.Lock()


class RedisCache(redis.RedisCache):
    @cached_property
    def _cache(self) -> redis.RedisCacheClient:
        key = (tuple(self._servers), repr(sorted(self._options.items())))
        with _LOCK:
            client = _CLIENTS.get(key)
            if client is None:
                client = _CLIENTS[key] = self._class(self._servers, **self._options)
        return client
