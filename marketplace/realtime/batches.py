"""Reports of many sockets written together (and reads of many sockets made together): a group commit.

At every publication each worker of the job reports its install, all within a second or two; written one at a
time, each took four statements and a commit on the sockets' database threads, and the reports of a thousand
workers queued there behind one another (and every socket's other database work behind them). A
:class:`GroupCommit` hands its ``write`` every item that arrived while the last write ran: alone, an item is
written at once (no timer, no wait added); under load, one write per round instead of one per item. Each caller
still awaits its own item's outcome, so a socket's frames keep their order and a refusal reaches its sender.

The sockets' reads of their workers' earnings are made the same way: a worker's is due every 10 s, so a thousand
workers make a hundred reads a second, each a query and a transaction; together, one per round.

An item waits in this process's memory only as its frame did before (in the socket's lane): a process that dies
loses them alike.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class GroupCommit(Generic[T, R]):
    """Items written in batches of at most ``max_items`` by ``write``, one batch at a time, per event loop.
    ``write`` returns an outcome per item (what its caller gets, or the exception it raises) or raises for them
    all."""

    def __init__(self, write: Callable[[Sequence[T]], Awaitable[Sequence[R | BaseException]]], *,
                 max_items: int = 500) -> None:
        self.write, self.max_items = write, max_items
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Queue[T]] = weakref.WeakKeyDictionary()

    async def submit(self, item: T) -> R:
        """Write ``item`` with whatever else waits; its outcome, or the exception that is its outcome raised. A
        caller cancelled while it waits does not take its item back: it is written all the same."""
        loop = asyncio.get_running_loop()
        queue = self._loops.get(loop)
        if queue is None:
            queue = self._loops[loop] = _Queue()
        future = loop.create_future()
        queue.pending.append((item, future))
        if queue.task is None:
            queue.task = loop.create_task(self._drain(queue), name="group-commit")
        return await future

    def waiting(self) -> int:
        """Items of the running event loop's that wait for the next write (not the one being written)."""
        queue = self._loops.get(asyncio.get_running_loop())
        return len(queue.pending) if queue is not None else 0

    async def _drain(self, queue: _Queue[T]) -> None:
        batch: list[tuple[T, asyncio.Future]] = []
        try:
            while queue.pending:
                batch, queue.pending = queue.pending[:self.max_items], queue.pending[self.max_items:]
                try:
                    outcomes = await self.write([item for item, _ in batch])
                except Exception as err:  # noqa: BLE001 - every caller of the batch gets it
                    outcomes = [err] * len(batch)
                for (_, future), outcome in zip(batch, outcomes, strict=True):
                    if future.done():  # its caller was cancelled
                        continue
                    if isinstance(outcome, BaseException):
                        future.set_exception(outcome)
                    else:
                        future.set_result(outcome)
        finally:
            queue.task = None
            for _, future in batch + queue.pending:  # cancelled itself (the loop closing): no outcome to give
                if not future.done():
                    future.cancel()
            queue.pending = []


class _Queue(Generic[T]):
    def __init__(self) -> None:
        self.pending: list[tuple[T, asyncio.Future]] = []
        self.task: asyncio.Task | None = None
