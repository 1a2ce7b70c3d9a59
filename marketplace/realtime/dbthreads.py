"""The agent sockets' database work, on a few threads of their own in each site process.

Channels' ``database_sync_to_async`` runs every call of a process on one thread. With a thousand sockets on two
processes, that thread was never idle and spent half its time waiting on PostgreSQL: every worker's state reports,
install reports, earnings reads and the shared read of the running job queued behind one another there, and a
socket's frames (its heartbeats too) wait behind its own call. ``ECHO2_AGENT_DB_THREADS`` threads let those waits
overlap. Each thread holds its own connection from the process's pool, closed around every call as Channels does
(``DatabaseSyncToAsync``), so a stale one is never used and none stays checked out between calls.

A socket still handles its frames in order, so its own calls never overlap; two sockets' calls may, as two site
processes' always could.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from channels.db import database_sync_to_async
from django.conf import settings

P = ParamSpec("P")
R = TypeVar("R")

_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None
_size = 0


def executor() -> ThreadPoolExecutor:
    """The process's threads for agent sockets' database calls, made at first use."""
    global _executor, _size
    with _lock:
        if _executor is None:
            _size = max(1, settings.ECHO2["AGENT_DB_THREADS"])
            _executor = ThreadPoolExecutor(max_workers=_size, thread_name_prefix="agent-db")
        return _executor


def size() -> int:
    """How many threads :func:`executor` has (or will have)."""
    executor()
    return _size


def database(func: Callable[P, R]) -> Callable[P, Awaitable[R]]:
    """``func`` as a coroutine function that runs it on one of :func:`executor`'s threads, its connection looked
    after as ``channels.db.database_sync_to_async`` does."""
    return database_sync_to_async(func, thread_sensitive=False, executor=executor())


def on_each_thread(func: Callable[[], object], timeout_s: float = 30.0) -> None:
    """Run ``func()`` once on every one of the threads (tests: close or watch the connection each holds). One task
    per thread, each held at a barrier until all run, so every thread takes one."""
    if _executor is None:
        return
    threads = size()
    barrier = threading.Barrier(threads)

    def run() -> None:
        func()
        barrier.wait(timeout=timeout_s)

    for future in [_executor.submit(run) for _ in range(threads)]:
        future.result(timeout=timeout_s)


def close_connections() -> None:
    """Close the connection each of the threads holds (where connections outlive a call: no pool, CONN_MAX_AGE
    above 0, as in tests)."""
    from django.db import connections

    on_each_thread(connections.close_all)
