"""A socket's requests, handled one at a time in the order they came, on a task of their own.

Channels hands a consumer its frames one at a time: a heartbeat that came behind a submit waited until the submit
was answered, and the submit, on a busy site, until the database threads got to its job's read. With 1,000
generating agents on two processes, heartbeats reached Redis 30-75 s after they were sent, and the workers looked
dead to anyone reading them. Once its hello is answered, the agent socket handles the site's pushes (assign, release,
snapshot) where they arrive, its heartbeats on a task of their own (:class:`Newest`: a Redis call each, and the
database report one calls for), and puts every other frame here, so a worker's liveness and its news never wait
behind its own requests, while its requests keep their order among themselves, each after the heartbeats sent
before it. Before the welcome,
everything comes here: the hello is answered before anything else is handled.

A heartbeat handled where it arrived held the socket's next frames (Channels hands a consumer one at a time) for
its Redis call, which on a process short of CPU took as long as the loop's turn: at 1,000 generating agents on two
processes, p50 0.2-1.3 s and p99 up to 8 s, and the next heartbeat and every push waited as long (a one-off probe,
docs/fleet.md). On a task of its own, a heartbeat that comes while the last one's call runs waits for it, and one
newer still replaces it: only the newest says how the worker is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


class Lane:
    """Coroutines run one at a time, in the order put, on one task (started at the first put)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._queue: asyncio.Queue[Callable[[], Awaitable[None]]] = asyncio.Queue()
        self._task: asyncio.Task | None = None

    def put(self, work: Callable[[], Awaitable[None]]) -> None:
        """Run ``work()`` after everything put before it. Its exceptions are logged: handle them in ``work``."""
        self._queue.put_nowait(work)
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=self.name)

    async def _run(self) -> None:
        while True:
            work = await self._queue.get()
            try:
                await work()
            except Exception:  # one request's bug must not stop the ones behind it
                log.exception("%s: a request failed", self.name)
            finally:
                self._queue.task_done()

    async def close(self, timeout_s: float) -> int:
        """Let what was put run to its end, for at most ``timeout_s`` (the socket closed: a frame that arrived
        before is still handled, as when Channels handled them in turn), then stop. Returns how many were left."""
        if self._task is None:
            return 0
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._queue.join(), timeout=timeout_s)
        left = self._queue.qsize()
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self._task = None
        return left

    def cancel(self) -> None:
        """Stop at once, whatever waits (the socket's application ended without its close: daphne gave up on it)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None


class Newest:
    """Work of one kind run one at a time on a task of its own, where only the newest waiting matters: what is put
    while one runs replaces what waits for it (a socket's heartbeats, and their database reports: each says how the
    worker is now, so one that waited behind a slow one is worth nothing once a newer came)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._waiting: Callable[[], Awaitable[None]] | None = None
        self._task: asyncio.Task | None = None
        self.replaced = 0  # works put and replaced before they ran

    def put(self, work: Callable[[], Awaitable[None]]) -> None:
        """Run ``work()`` once what runs now is done, unless newer work is put before then. Its exceptions are
        logged: handle them in ``work``."""
        self.replaced += self._waiting is not None
        self._waiting = work
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=self.name)

    async def _run(self) -> None:
        while self._waiting is not None:  # no await between the check and the end: a put sees this task done
            work, self._waiting = self._waiting, None
            try:
                await work()
            except Exception:  # noqa: BLE001 - one's bug must not stop the next
                log.exception("%s: a request failed", self.name)

    async def done(self) -> None:
        """Return once what runs or waits now is done (and what was put meanwhile); at once when nothing runs. A
        failure or cancellation of that work is not raised here."""
        if self._task is not None and not self._task.done():
            await asyncio.wait({self._task})

    async def close(self, timeout_s: float) -> None:
        """Let what runs and waits end, for at most ``timeout_s``, then stop."""
        if self._task is not None:
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(self._task), timeout=timeout_s)
        self.cancel()

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self._waiting = None
