"""What one agent socket remembers of its worker's running job between messages.

A lease and a group are checked against the worker's running activation: the job is running, the group's size, the
newest published version, the record limits. Read from the database on every message, that was most of the site's
time under load; the socket keeps it here instead and reads it again only when it may have changed:

- every push to the agent (assign, release, snapshot) passes through the socket, which forgets what it holds: a
  release (pause, cancel, finish, stall, scale-down) ends the activation, a snapshot raises ``published_version``;
- and after ``max_age_s`` (``ECHO2_AGENT_STATE_MAX_AGE_S``, default 2 s) whatever happens, so a push lost on the
  way (the channel layer is best effort) cannot hold stale state longer than that.

Whatever slips through those two, the replay buffer's return script still refuses a group whose lease is no longer
this worker's (a released worker's leases are handed back at once), so a stale entry can never put a released
worker's group in the stream for a lease it lost.

What a socket reads again comes from :data:`JOBS` when it can: one read of a running job per process (its fields and
the workers active in it, ``services.rollouts.job_at_work``), shared by every socket of the process, instead of a
query per socket every ``max_age_s`` (a hundred generating agents made fifty a second). A socket takes a shared read
only if it began after the socket last forgot (a push, or the socket's start: :attr:`FreshFor.cleared_at`) and is
younger than ``max_age_s``: exactly what the socket would have read itself. Since the sockets took one read, their
holds run out together and each waited for the next read (under load, a second per submit at 1,000 agents on two
processes): a socket that uses its hold starts the next shared read in the background once the newest is half its
age (:meth:`SharedReads.refresh`), so the holds that run out find a younger read waiting.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)
REFRESH_AT = 0.5  # of max_age_s: the age of the newest shared read at which the next one starts in the background


class FreshFor(Generic[T]):
    """Values by job id, each kept at most ``max_age_s`` seconds after it was read."""

    def __init__(self, max_age_s: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_age_s, self.clock = max_age_s, clock
        self._held: dict[int, tuple[float, T]] = {}
        self.cleared_at = clock()  # a read that began before this is not this holder's to take (SharedReads)

    def get(self, job_id: int) -> T | None:
        """The value read for ``job_id`` less than ``max_age_s`` ago, else None (and it is forgotten)."""
        held = self._held.get(job_id)
        if held is None:
            return None
        if self.clock() - held[0] >= self.max_age_s:
            del self._held[job_id]
            return None
        return held[1]

    def put(self, job_id: int, value: T, *, read_at: float) -> None:
        """Keep ``value``, read at ``read_at`` (the clock's time when the read began: its age counts from then)."""
        if self.max_age_s > 0:
            self._held[job_id] = (read_at, value)

    def clear(self) -> None:
        self._held.clear()
        self.cleared_at = self.clock()


class SharedReads(Generic[T]):
    """Reads by job id shared by every socket of the process, each with the time it began; the newest read is
    kept. A socket takes one only if it began at or after ``not_before`` (:attr:`FreshFor.cleared_at`) and is
    younger than ``max_age_s``."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._held: dict[int, tuple[float, T]] = {}
        self._flying: dict[int, tuple[float, asyncio.Future]] = {}
        self._refreshing: set[asyncio.Task] = set()  # held until done: a task the loop alone holds may be collected

    def get(self, job_id: int, *, not_before: float, max_age_s: float) -> tuple[float, T] | None:
        """(when the read began, the value), or None when there is none this socket may take."""
        held = self._held.get(job_id)
        if held is None or held[0] < not_before or self.clock() - held[0] >= max_age_s:
            return None
        return held

    def put(self, job_id: int, value: T, *, read_at: float) -> None:
        held = self._held.get(job_id)
        if held is None or held[0] <= read_at:
            self._held[job_id] = (read_at, value)

    async def read(self, job_id: int, read: Callable[[], Awaitable[T]], *, not_before: float,
                   max_age_s: float) -> tuple[float, T]:
        """(when the read began, the value): a held one this socket may take, else the read in flight if it began
        at or after ``not_before``, else ``read()`` now, shared. The sockets whose holds ran out together (they took
        one read, so they do) wait for one read, not one each."""
        held = self.get(job_id, not_before=not_before, max_age_s=max_age_s)
        if held is not None:
            return held
        flying = self._flying.get(job_id)
        if flying is not None and flying[0] >= not_before:
            return flying[0], await asyncio.shield(flying[1])
        read_at, future = self._begin(job_id)
        return read_at, await self._complete(job_id, read, read_at, future)

    def refresh(self, job_id: int, read: Callable[[], Awaitable[T]], *, max_age_s: float) -> None:
        """Start ``read()`` in the background, shared as :meth:`read` shares it (in flight from now on), when the
        newest read of ``job_id`` (held or in flight) began ``REFRESH_AT * max_age_s`` or more ago. A failure is
        logged: the sockets then read when their holds run out, as without it."""
        if max_age_s <= 0:
            return
        newest = max(self._held.get(job_id, (-math.inf,))[0], self._flying.get(job_id, (-math.inf,))[0])
        if self.clock() - newest < REFRESH_AT * max_age_s:
            return
        read_at, future = self._begin(job_id)
        task = asyncio.get_running_loop().create_task(self._read_aside(job_id, read, read_at, future))
        self._refreshing.add(task)
        task.add_done_callback(self._refreshing.discard)

    def _begin(self, job_id: int) -> tuple[float, asyncio.Future]:
        """A read of ``job_id`` in flight from now: (when it began, its outcome to come)."""
        read_at, future = self.clock(), asyncio.get_running_loop().create_future()
        self._flying[job_id] = (read_at, future)
        return read_at, future

    async def _complete(self, job_id: int, read: Callable[[], Awaitable[T]], read_at: float,
                        future: asyncio.Future) -> T:
        try:
            value = await read()
        except BaseException as err:
            future.set_exception(err)
            future.exception()  # retrieved: a failed read with no one else waiting is not an unhandled error
            raise
        finally:
            if self._flying.get(job_id, (0.0, None))[1] is future:
                del self._flying[job_id]
        future.set_result(value)
        self.put(job_id, value, read_at=read_at)
        return value

    async def _read_aside(self, job_id: int, read: Callable[[], Awaitable[T]], read_at: float,
                          future: asyncio.Future) -> None:
        try:
            await self._complete(job_id, read, read_at, future)
        except Exception as err:  # noqa: BLE001 - nobody waits on it; the next socket to need it reads again
            log.warning("job %s: reading it ahead failed (%s: %s)", job_id, type(err).__name__, err)


JOBS: SharedReads = SharedReads()
"""The running jobs this process read for its agent sockets (``services.rollouts.JobAtWork``)."""
