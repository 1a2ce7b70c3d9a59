"""An event loop's Redis client, whose every call is bounded by a deadline of its own.

The agent socket makes its Redis calls on daphne's event loop (heartbeats, leases, submits: no thread hop). redis-py
bounds an asyncio connection's writes with ``socket_timeout`` through ``asyncio.wait_for``, which on Python 3.11
makes a task per command, and its reads with a timeout context each: together a fifth of a heartbeat's CPU on a
site process serving 300 generating agents (py-spy, docs/fleet.md). The connections here carry no socket timeout;
each call is bounded instead as a whole (send, reply, and any wait for a connection of the pool) by one
``asyncio.timeout`` (:func:`bounded`), which raises what a socket timeout raised (``redis.TimeoutError``), so the
callers' retries treat it as before. Every call on such a client must go through :func:`bounded` or
:func:`run_script`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

import redis
import redis.asyncio
from redis.backoff import NoBackoff

from .replay_scripts import script

T = TypeVar("T")


class AsyncClient(redis.asyncio.Redis):
    """A redis-py asyncio client whose calls :func:`bounded` limits to ``call_timeout_s`` each."""

    call_timeout_s: float = 10.0


def connect_async(url: str, *, max_connections: int, decode_responses: bool = True, socket_timeout: float = 10.0,
                  ca_file: str | None = None) -> AsyncClient:
    """A client for ``url`` on an event loop (bound to the loop it first runs on), as ``dataplane.replay.connect``
    (no silent retries of redis-py's own; TLS for ``rediss://``), its pool bounded: a caller waits at most
    ``socket_timeout`` for one of ``max_connections`` connections, so many coroutines at once share a few. Each call
    through :func:`bounded` or :func:`run_script` takes at most ``socket_timeout`` in all."""
    tls = {"ssl_ca_certs": ca_file} if ca_file and url.startswith("rediss://") else {}
    pool = redis.asyncio.BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=socket_timeout, decode_responses=decode_responses,
        socket_timeout=None, socket_connect_timeout=min(socket_timeout, 10.0),
        retry=redis.asyncio.retry.Retry(NoBackoff(), 0), **tls)
    client = AsyncClient.from_pool(pool)  # it owns the pool: closing the client closes the connections
    client.call_timeout_s = socket_timeout
    return client


async def bounded(client: AsyncClient, call: Awaitable[T]) -> T:
    """``call`` (a call on ``client``), given at most ``client.call_timeout_s``; past it, ``redis.TimeoutError``
    (the call is cancelled, and redis-py drops a connection cancelled mid-reply, so no late reply is read as
    another's)."""
    try:
        async with asyncio.timeout(client.call_timeout_s):
            return await call
    except TimeoutError as err:
        raise redis.TimeoutError(f"no reply from Redis within {client.call_timeout_s:g} s") from err


async def run_script(client: AsyncClient, text: str, *, keys: Sequence[Any], args: Sequence[Any]) -> Any:
    """Script ``text`` run on ``client`` by its SHA (EVALSHA), loaded first when the server does not know it (after
    a restart or SCRIPT FLUSH), within :func:`bounded`'s deadline. What redis-py's ``Script.__call__`` does, less
    its check of whether the client is a pipeline, an ABC subclass check that cost as much as a heartbeat's Redis
    round trip on a busy site."""
    sha = script(client, text).sha

    async def call() -> Any:
        try:
            return await client.evalsha(sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            await client.script_load(text)
            return await client.evalsha(sha, len(keys), *keys, *args)

    return await bounded(client, call())


async def run_scripts(client: AsyncClient, text: str, calls: Sequence[tuple[Sequence[Any], Sequence[Any]]]) -> list:
    """Script ``text`` run once per ``(keys, args)`` of ``calls``, all in one round trip (a pipeline of EVALSHAs,
    within :func:`bounded`'s deadline): each call's result, or the error the server answered it with. Calls the
    server did not run for want of the script (NOSCRIPT) are run again once it is loaded. A connection error or the
    deadline raises for all."""
    sha = script(client, text).sha

    async def once(which: list[int]) -> list:
        pipe = client.pipeline(transaction=False)
        for i in which:
            keys, args = calls[i]
            pipe.evalsha(sha, len(keys), *keys, *args)
        return await bounded(client, pipe.execute(raise_on_error=False))

    results = await once(list(range(len(calls))))
    missing = [i for i, r in enumerate(results) if isinstance(r, redis.exceptions.NoScriptError)]
    if missing:
        await bounded(client, client.script_load(text))
        for i, result in zip(missing, await once(missing), strict=True):
            results[i] = result
    return results
