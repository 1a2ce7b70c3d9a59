"""A socket's requests, handled one at a time in the order they came, on a task of their own.

Channels hands a consumer its frames one at a time: a heartbeat that came behind a submit waited until the submit
was answered, and the submit, on a busy site, until the database threads got to its job's read. With 1,000
generating agents on two processes, heartbeats reached Redis 30-75 s after they were sent, and the workers looked
dead to anyone reading them. Once its hello is answered, the agent socket handles a heartbeat where it arrives (one
Redis call on the event loop), and the site's pushes (assign, release, snapshot) too, and puts every other frame
here, so a worker's liveness and its news never wait behind its own requests, while its requests (and the database
reports its heartbeats call for) keep their order among themselves. Before the welcome, everything comes here: the
hello is answered before anything else is handled.
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
