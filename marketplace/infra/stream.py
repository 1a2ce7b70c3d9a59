"""The site's connection to the trajectory streams' Redis: the replay buffer of each job (``dataplane.replay``) and
the live state kept beside it (heartbeats, telemetry, fan-out records: scripts write both in one call).

One client per process, from ``settings.STREAMS_REDIS_URL`` (``ECHO2_STREAMS_REDIS_URL``; empty: ``REDIS_URL``), with
the site's full rights: learners get users of their own there (``learner_door``). The channel layer, the Celery
broker and the cache stay on ``REDIS_URL``. Every call on it times out.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from functools import lru_cache

import redis
from django.conf import settings

from dataplane.redis_async import AsyncClient, connect_async
from dataplane.replay import ReplayBuffer, connect


def url() -> str:
    """The streams' Redis as the site reaches it (with the site's own credentials)."""
    return settings.STREAMS_REDIS_URL or settings.REDIS_URL


@lru_cache(maxsize=1)
def client() -> redis.Redis:
    return connect(url(), decode_responses=True, socket_timeout=10)


# Connections per event loop and purpose. Heartbeats have a pool of their own: with a thousand sockets' submits
# queued for the requests' connections on a saturated machine, heartbeats that shared it waited past the pool's
# 10 s and were refused ("No connection available"). A call holds its connection from its send until the event loop
# reads its reply: a round trip (~0.1 ms) on a quiet site, but as long as the loop's turn on a process short of CPU
# (1,000 generating agents on two processes and two cores). With 4 and 8 there, heartbeats waited for a connection
# (p50 14 s, 0% within 1 s) and submits were refused; with 64 each, 56-76% and 4 refusals (docs/fleet.md).
ASYNC_CONNECTIONS = {"requests": 64, "liveness": 64}
# Each running loop's clients by URL, and the generator that closes them with the loop (held here: a loop keeps only
# a weak reference to it).
_ASYNC: dict[asyncio.AbstractEventLoop, tuple[dict[tuple[str, str], AsyncClient], AsyncIterator[None]]] = {}


def async_client(purpose: str = "requests") -> AsyncClient:
    """The streams' client for the running event loop, set up as :func:`client` (``dataplane.replay.connect_async``)
    for the agent socket's calls that would each take a thread hop (which costs more CPU than the call). An asyncio
    client is bound to the loop that made it, so there is one per loop (daphne's one; a test's own), closed when
    its loop shuts down. Its pool is bounded: a thousand sockets' heartbeats at once share a few connections (an
    unbounded one would open one per heartbeat in flight, up to Redis' maxclients). ``purpose``: "requests" (leases,
    groups, submits, counters) or "liveness" (heartbeats), each with its own pool (``ASYNC_CONNECTIONS``)."""
    loop = asyncio.get_running_loop()
    held = _ASYNC.get(loop)
    if held is None:
        for closed in [other for other in _ASYNC if other.is_closed()]:  # closed without shutting its generators
            del _ASYNC[closed]
        clients: dict[tuple[str, str], AsyncClient] = {}
        keeper = _closed_with_the_loop(loop, clients)
        held = _ASYNC[loop] = clients, keeper
        loop.create_task(anext(keeper))
    clients = held[0]
    target = url()
    found = clients.get((target, purpose))
    if found is None:
        found = clients[target, purpose] = connect_async(target, max_connections=ASYNC_CONNECTIONS[purpose])
    return found


async def _closed_with_the_loop(loop: asyncio.AbstractEventLoop,
                               clients: dict[tuple[str, str], AsyncClient]) -> AsyncIterator[None]:
    """Waits for its loop's shutdown: ``asyncio.run`` (and every test's loop) closes a loop's unfinished async
    generators first (``shutdown_asyncgens``), so this closes the loop's clients while it still runs (a transport
    cannot be closed once its loop is) and forgets them."""
    try:
        yield
    finally:
        _ASYNC.pop(loop, None)
        for found in clients.values():
            with contextlib.suppress(Exception):  # shutting down: nothing to tell anyone
                await found.aclose()


def replay(job_id: int) -> ReplayBuffer:
    """Job ``job_id``'s streams: leases, returned groups, counters. A site request rides out a short Redis
    outage (``ECHO2_REDIS_RETRY_S``, default 5 s) and then answers with an error the agent retries."""
    return ReplayBuffer(client(), job_id, retry_for_s=float(settings.ECHO2["REDIS_RETRY_S"]))
