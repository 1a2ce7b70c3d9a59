"""The Channels layer over Redis, riding out a Redis restart.

``channels_redis``' layer raises a connection error out of ``receive`` while Redis is away, and Channels
turns that into a crashed consumer: every agent socket closed with 1011 at once, every agent reconnecting,
re-joining and re-announcing itself (the fault bench measured 8 s of lost rollouts for a 1 s restart). This
layer waits instead: ``receive`` retries with exponential backoff and jitter for as long as its consumer
lives (Channels cancels it when the socket closes), and once Redis answers again it joins the groups its
channels were in afresh, since a Redis without persistence lost them. Group joins retry for a bounded time
(the socket is refused after that); leaving a group is best effort (memberships expire on their own).

Re-joins that keep an old membership alive (``rejoin``) are made together: the channels of one event loop due at
the same moment share one pipelined ``ZADD`` per group on one connection. ``channels_redis`` runs each
``group_add`` on a connection of its own while others are in flight, so 10,000 sockets re-joining at one
publication opened 10,000 Redis connections ("max number of clients reached").

The process's own channels (``specific.<client>!<id>``, one per agent socket) are read by ONE task per layer
(:class:`_Reader`), which hands each message to the queues of the channels it names. ``channels_redis`` has every
waiting ``receive`` race for a lock with a queue read of its own: two tasks and an ``asyncio.wait`` per socket per
message, and each cancelled lock wait taken out of a queue of thousands, so telling 5,000 sockets of one group
message cost ~110 us of CPU each (1,000: ~50 us), where a queue put and a wake-up is what it must cost. The reader
takes what waits for the process in batches (:meth:`ResilientRedisChannelLayer.receive_local`): ``receive_single``
takes one message per three sequential round trips, so a thousand assignments pushed to one process's sockets
reached the last one seconds later on a busy event loop, each round trip waiting its turn.

Pushes (``group_send``) are not retried here: the site's pushes are best effort by design
(``services.base._push``), and agents catch up on their next hello or request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import weakref
from collections import defaultdict
from collections.abc import Awaitable, Callable

from channels_redis.core import BoundedQueue, RedisChannelLayer

from dataplane.replay import TRANSIENT
from dataplane.replay_scripts import script

log = logging.getLogger("echo2.channels")

JOIN_RETRY_S = 10.0
BACKOFF_CAP_S = 2.0
LOCAL_BATCH = 256  # messages the reader takes in one round trip

# The process channel's batch read, atomic: forget the messages the last batch delivered (ARGV[2..]), put back in
# order any the backup still holds (taken by a read that was cut short), then move up to ARGV[1] of the oldest to
# the backup and return them. channels_redis' backup queue, kept: what a cancelled read took is read again.
_TAKE_BATCH = """
if #ARGV > 1 then redis.call('ZREM', KEYS[2], unpack(ARGV, 2)) end
local backed = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
for i = #backed, 1, -2 do redis.call('ZADD', KEYS[1], backed[i], backed[i - 1]) end
redis.call('DEL', KEYS[2])
local taken = redis.call('ZPOPMIN', KEYS[1], ARGV[1])
for i = 1, #taken, 2 do redis.call('ZADD', KEYS[2], taken[i + 1], taken[i]) end
return taken
"""


def _backoff(attempt: int) -> float:
    """Seconds before retry ``attempt`` (0-based): doubling from 50 ms up to the cap, with full jitter."""
    return random.uniform(0.5, 1.0) * min(BACKOFF_CAP_S, 0.05 * 2 ** attempt)


class ResilientRedisChannelLayer(RedisChannelLayer):
    """``RedisChannelLayer`` whose consumers survive Redis going away and coming back."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.memberships: dict[str, set[str]] = defaultdict(set)  # channel -> groups it joined through us
        self._batches: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # event loop -> _Rejoins
        self._reader: _Reader | None = None  # reads this process's channels (one event loop's at a time)
        self.local_queues: dict[str, asyncio.Queue] = {}  # process-local channel -> messages not yet received
        self.local_delivered: list[bytes] = []  # the reader's last batch, handed on, still in Redis' backup queue

    async def receive(self, channel: str) -> dict:
        if "!" in channel:  # this process's own: from the reader's queue
            return await self._local_reader().get(channel)
        attempt = 0
        while True:
            try:
                if attempt:
                    await self._rejoin(channel)
                message = await super().receive(channel)
            except TRANSIENT as err:
                if attempt == 0:
                    log.warning("channel layer: Redis unreachable (%s); %s waits for it", err, channel)
                await asyncio.sleep(_backoff(attempt))
                attempt += 1
                continue
            if attempt:
                log.info("channel layer: Redis is back for %s", channel)
            return message

    def _local_reader(self) -> _Reader:
        loop = asyncio.get_running_loop()
        reader = self._reader
        if reader is None or (reader.loop is not loop and (reader.idle() or reader.loop.is_closed())):
            reader = self._reader = _Reader(self, loop)
        elif reader.loop is not loop:  # as channels_redis: two loops would split the process's messages between them
            raise RuntimeError("Two event loops are trying to receive() on one channel layer at once!")
        return reader

    async def receive_local(self, channel: str, delivered: list[bytes]) -> tuple[list[bytes], list[tuple]]:
        """What waits for the process's ``channel``, up to ``LOCAL_BATCH`` messages, oldest first, after forgetting
        ``delivered`` (the raw messages of the last batch, handed on); when none waits, the first to come within
        ``brpop_timeout`` s, or none. Returns the raw messages (each kept in channels_redis' backup queue until a
        later call forgets it) and each readable one as ``(channel or channels it names, message)``; one that
        cannot be read is logged and forgotten with the rest."""
        key = self.prefix + channel
        backup = self._backup_channel_name(key)
        connection = self.connection(self.consistent_hash(channel))
        raw = (await script(connection, _TAKE_BATCH)(keys=[key, backup], args=[LOCAL_BATCH, *delivered]))[0::2]
        if not raw:  # nothing waits: block for the next, as channels_redis does (kept in the backup once taken)
            popped = await connection.bzpopmin(key, timeout=self.brpop_timeout)
            if popped is None:
                return [], []
            _, member, score = popped
            await connection.zadd(backup, {member: float(score)})
            raw = [member]
        messages = []
        for member in raw:
            try:
                message = self.deserialize(member)
            except Exception:  # noqa: BLE001 - one unreadable message must not stop the process's others
                log.exception("channel layer: a message for this process could not be read; dropped")
                continue
            messages.append((message.pop("__asgi_channel__", channel), message))
        return raw, messages

    async def close_pools(self) -> None:
        if self._reader is not None and self._reader.loop is asyncio.get_running_loop():
            await self._reader.stop()
        await super().close_pools()

    async def group_add(self, group: str, channel: str) -> None:
        await _retry_joining(lambda: super(ResilientRedisChannelLayer, self).group_add(group, channel))
        self.memberships[channel].add(group)

    async def rejoin(self, group: str, channel: str) -> None:
        """Renew ``channel``'s membership of ``group``, batched with every other re-join due on this event loop
        at the same moment (one connection, one round trip per group and batch); raises as ``group_add``."""
        loop = asyncio.get_running_loop()
        batch = self._batches.get(loop)
        if batch is None:
            batch = self._batches[loop] = _Rejoins(self)
        await batch.add(group, channel)
        self.memberships[channel].add(group)

    async def group_add_many(self, group: str, channels: list[str]) -> None:
        """Add ``channels`` to ``group`` in one pipelined round trip, retried as ``group_add``."""
        key = self._group_key(group)

        async def add() -> None:
            async with self.connection(self.consistent_hash(group)).pipeline(transaction=False) as pipe:
                pipe.zadd(key, dict.fromkeys(channels, time.time()))
                pipe.expire(key, self.group_expiry)
                await pipe.execute()

        await _retry_joining(add)

    async def group_discard(self, group: str, channel: str) -> None:
        self.memberships[channel].discard(group)
        if not self.memberships[channel]:
            del self.memberships[channel]
        try:
            await super().group_discard(group, channel)
        except TRANSIENT as err:  # the membership expires by itself (group_expiry); nothing is lost
            log.info("channel layer: could not leave %s for %s (%s)", group, channel, err)

    async def _rejoin(self, channel: str) -> None:
        """Join ``channel``'s groups again (raises while Redis is still away: the caller retries)."""
        for group in list(self.memberships.get(channel, ())):
            await super().group_add(group, channel)


class _Reader:
    """The one task of an event loop that reads the layer's process-local messages (``receive_local`` on the process's
    channel, a batch a round trip) and puts each into the queue of every channel it names; a ``receive`` of a local
    channel waits on its queue alone. It runs while any receive waits and rides out Redis going away as ``receive``
    does: retrying with backoff, then joining again, in one round trip a group, the groups of every channel joined
    through this layer (a Redis without persistence lost them). A message for a channel between two receives waits in
    its bounded queue, which the layer holds as channels_redis holds its buffer (a later event loop's receive finds it);
    a channel whose receive was cancelled (its socket closed) is forgotten."""

    def __init__(self, layer: ResilientRedisChannelLayer, loop: asyncio.AbstractEventLoop) -> None:
        self.layer, self.loop = layer, loop
        self.queues = layer.local_queues  # the layer's: what one loop's reader took waits for the next loop's
        self.waiting: dict[str, int] = defaultdict(int)  # channel -> receives waiting on it
        self.task: asyncio.Task | None = None

    def idle(self) -> bool:
        return not self.waiting and (self.task is None or self.task.done())

    async def get(self, channel: str) -> dict:
        queue = self.queues.get(channel)
        if queue is None:
            queue = self.queues[channel] = BoundedQueue(self.layer.capacity)
        if not queue.empty():
            message = queue.get_nowait()
        else:
            self.waiting[channel] += 1
            if self.task is None or self.task.done():
                self.task = self.loop.create_task(self._run(self.layer.non_local_name(channel)))
            closed = False
            try:
                message = await queue.get()
            except asyncio.CancelledError:
                closed = True
                raise
            finally:
                self.waiting[channel] -= 1
                if not self.waiting[channel]:
                    del self.waiting[channel]
                    if closed:  # its socket closed: what it had not read goes with it
                        self.queues.pop(channel, None)
                if not self.waiting:  # none again by the next turn (a socket's next receive): stop reading
                    self.loop.call_soon(self._stop_if_idle)
        if queue.empty() and channel not in self.waiting:
            self.queues.pop(channel, None)
        return message

    def _stop_if_idle(self) -> None:
        if not self.waiting and self.task is not None:
            # a batch read cut short loses nothing (the backup queue); a BZPOPMIN cut short as its message came
            # does, as channels_redis' receive would: the one window left
            self.task.cancel()
            self.task = None

    async def stop(self) -> None:
        task, self.task = self.task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self, real_channel: str) -> None:
        attempt = 0
        while True:
            try:
                if attempt:
                    await self._rejoin_all()
                raw, batch = await self.layer.receive_local(real_channel, self.layer.local_delivered)
            except TRANSIENT as err:
                if attempt == 0:
                    log.warning("channel layer: Redis unreachable (%s); this process's sockets wait for it", err)
                await asyncio.sleep(_backoff(attempt))
                attempt += 1
                continue
            except Exception:  # a message it cannot read: logged, never the end of every socket's reads
                log.exception("channel layer: a message for this process could not be read; reading on")
                await asyncio.sleep(_backoff(attempt))
                continue
            if attempt:
                log.info("channel layer: Redis is back for this process's sockets")
                attempt = 0
            # no await from the read to here: a batch taken is handed on whole before the reader can be cancelled
            self.layer.local_delivered = raw
            for named, message in batch:
                for channel in named if isinstance(named, list) else (named,):
                    queue = self.queues.get(channel)
                    if queue is None:
                        queue = self.queues[channel] = BoundedQueue(self.layer.capacity)
                    queue.put_nowait(message)

    async def _rejoin_all(self) -> None:
        by_group: dict[str, list[str]] = defaultdict(list)
        for channel, groups in list(self.layer.memberships.items()):
            for group in groups:
                by_group[group].append(channel)
        for group, channels in by_group.items():
            await self.layer.group_add_many(group, sorted(channels))


class _Rejoins:
    """The re-joins of one event loop: the first due starts a flush, which yields once so that the sockets handling
    the same event add theirs, then writes all pending ones; re-joins added while it writes go in its next round.
    One flush at a time, so one connection at a time, however many sockets are due."""

    def __init__(self, layer: ResilientRedisChannelLayer) -> None:
        self.layer = layer
        self.pending: dict[str, set[str]] = defaultdict(set)
        self.flushing: asyncio.Task | None = None
        self.rounds = 0  # batches written (the tests count them)

    async def add(self, group: str, channel: str) -> None:
        self.pending[group].add(channel)
        if self.flushing is None:
            self.flushing = asyncio.get_running_loop().create_task(self._flush())
        await asyncio.shield(self.flushing)  # a socket closing while it waits must not cancel the others' write

    async def _flush(self) -> None:
        try:
            await asyncio.sleep(0)
            while self.pending:
                due, self.pending = self.pending, defaultdict(set)
                self.rounds += 1
                for group, channels in due.items():
                    await self.layer.group_add_many(group, sorted(channels))
        finally:
            self.flushing = None
            self.pending.clear()  # a failed write fails its waiters; they try again at their next event


async def _retry_joining(join: Callable[[], Awaitable[None]]) -> None:
    """Run ``join`` until it succeeds, backing off while Redis is unreachable, for ``JOIN_RETRY_S`` at most (then
    it raises): a socket's membership is worth a short wait, not a dropped connection."""
    attempt, waited = 0, 0.0
    while True:
        try:
            await join()
            return
        except TRANSIENT:
            if waited >= JOIN_RETRY_S:
                raise
            delay = _backoff(attempt)
            await asyncio.sleep(delay)
            attempt, waited = attempt + 1, waited + delay
