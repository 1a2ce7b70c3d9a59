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

READ_THREADS = 2  # for the reads a reply waits on (:func:`database_read`), beside ECHO2_AGENT_DB_THREADS

_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None
_readers: ThreadPoolExecutor | None = None


def executor() -> ThreadPoolExecutor:
    """The process's threads for agent sockets' database calls, made at first use."""
    global _executor
    with _lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=max(1, settings.ECHO2["AGENT_DB_THREADS"]),
                                           thread_name_prefix="agent-db")
        return _executor


def readers() -> ThreadPoolExecutor:
    """The process's threads for :func:`database_read`, made at first use."""
    global _readers
    with _lock:
        if _readers is None:
            _readers = ThreadPoolExecutor(max_workers=READ_THREADS, thread_name_prefix="agent-db-read")
        return _readers


def size() -> int:
    """How many threads :func:`executor` has (or will have)."""
    return executor()._max_workers


def database(func: Callable[P, R]) -> Callable[P, Awaitable[R]]:
    """``func`` as a coroutine function that runs it on one of :func:`executor`'s threads, its connection looked
    after as ``channels.db.database_sync_to_async`` does."""
    return database_sync_to_async(func, thread_sensitive=False, executor=executor())


def database_read(func: Callable[P, R]) -> Callable[P, Awaitable[R]]:
    """:func:`database` for a read that takes no lock and that a reply waits on (the running job, the earnings):
    on threads of their own, so it never queues behind writes that wait for a row another transaction holds (the
    folds', a re-plan's), as every socket's submit did behind the fleet's state reports."""
    return database_sync_to_async(func, thread_sensitive=False, executor=readers())


def on_each_thread(func: Callable[[], object], timeout_s: float = 30.0) -> None:
    """Run ``func()`` once on every one of the threads of both pools (tests: close or watch the connection each
    holds). One task per thread, each held at a barrier until all run, so every thread takes one."""
    for pool in (p for p in (_executor, _readers) if p is not None):
        threads = pool._max_workers
        barrier = threading.Barrier(threads)

        def run(barrier: threading.Barrier = barrier) -> None:
            func()
            barrier.wait(timeout=timeout_s)

        for future in [pool.submit(run) for _ in range(threads)]:
            future.result(timeout=timeout_s)


def close_connections() -> None:
    """Close the connection each of the threads holds (where connections outlive a call: no pool, CONN_MAX_AGE
    above 0, as in tests)."""
    from django.db import connections

    on_each_thread(connections.close_all)
