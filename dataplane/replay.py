"""The replay buffer: a job's version-tagged storage in Redis streams (paper section 4.1, appendix F).

One module owns every key and consumer group (its Lua scripts are in ``replay_scripts``, what they answer in
``replay_outcomes``, the groups the learner reads back in ``stored``), and both the site (leases, returns) and the
learner (prompt top-up, the staleness-gated reader in ``learner.consumer``) use it. ``redis`` is an optional
dependency of this module alone: the agent never imports it (agents never talk to Redis).

Keys of job ``j``:

prompts       ``echo2:job:j:prompts``: stream of prompt groups (fields ``group_id``, ``prompt``). The
              consumer group ``leases`` hands one entry per lease to a worker's consumer; the entry stays
              pending until its group returns, and one idle past the lease timeout is claimed by the next
              worker that asks (XAUTOCLAIM), so no prompt is lost. A released worker's leases are handed
              back at once (``return_leases``).
trajectories  ``echo2:job:j:trajectories``: stream of accepted groups (fields ``lease_id``, ``worker_id``: the
              worker the site accepted it from, ``data``: the :class:`~dataplane.records.TrajectoryGroup`
              (``dataplane.groupcodec``), ``seal``: the site's HMAC of the other three and the job
              (``dataplane.seal``; readers pass it by). The consumer group ``learner`` feeds the trainer, which
              acknowledges (and deletes) an entry only once trained or dropped as stale.
counters      ``echo2:job:j:counters``: hash of per-job counters (accepted_groups, accepted_records, ...).
delivered     ``echo2:job:j:delivered``: hash of the groups accepted from each worker (field: the worker id), counted
              with the group: the site's evidence of what a worker delivered to the job, which bounds the audits
              the learner may report of it (docs/trust.md "Audits of work").

Every operation rides out a Redis restart: a connection error is retried with exponential backoff and
jitter for up to ``retry_for_s`` seconds, and a consumer group lost with the data (a Redis without
persistence) is created again. With AOF (``appendfsync everysec``) a restart loses at most the last second;
without persistence it loses the streams: leased prompts come back from the learner's top-up, and groups not
yet trained are gone (counted by nobody) -- run Redis with AOF.

Returning a group is one Lua script (loaded once, then called by its SHA): check the lease is still
this worker's and names this group and its prompt, append the group, acknowledge and delete the prompt, count it, and
add the caller's :class:`TimedEvent` (the site's accepted-records evidence: its key is the caller's). So a group is
accepted at most once, a prompt is never lost, and the whole return is one round trip. A lease is one script too:
expired leases first (XAUTOCLAIM), fresh prompts for the remainder (XREADGROUP). A worker's whole request (groups
returned, its leases renewed, more leased, and the outcome kept for a resend of the request) is one script as well:
:meth:`ReplayBuffer.submit`.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

import redis
from redis.backoff import NoBackoff
from redis.client import NEVER_DECODE
from redis.retry import Retry

from .groupcodec import encode_group
from .records import TrajectoryGroup
from .redis_async import AsyncClient, bounded, run_script
from .replay_outcomes import (
    KeptVerdict,
    LeasedPrompt,
    LeaseError,
    Submitted,
    TimedEvent,
    kept_outcome,
    return_error,
    returned,
)
from .replay_scripts import ACK_COUNTED, LEASE, RENEW, RETURN_ERRORS, RETURN_GROUP, SUBMIT, script
from .seal import seal
from .stored import StoredGroup, field, stored_entry, text

log = logging.getLogger("echo2.replay")
T = TypeVar("T")
TRANSIENT = (redis.ConnectionError, redis.TimeoutError)  # a restart, an outage, a server still loading its AOF
# A password refused: the site deleted this learner's Redis user (its job ended, or another learner of the job took
# the door), or Redis lost its users in a restart and the site has not set them again yet (it does at the learner's
# next heartbeat, within seconds). Retried this long at most, so an ended job's learner stops soon.
AUTH_RETRY_S = 45.0

Client = redis.Redis
RedisError = redis.RedisError  # what a Redis outage raises: the planes catch it without importing redis

PROMPT_GROUP = "leases"
LEARNER_GROUP = "learner"


def prompts_key(job_id: int) -> str:
    return f"echo2:job:{job_id}:prompts"


def trajectories_key(job_id: int) -> str:
    return f"echo2:job:{job_id}:trajectories"


def counters_key(job_id: int) -> str:
    return f"echo2:job:{job_id}:counters"


def delivered_key(job_id: int) -> str:
    return f"echo2:job:{job_id}:delivered"


def returned_key(job_id: int, lease_id: str) -> str:
    """The marker of lease ``lease_id`` answered: who answered it, with which group, stored under which entry."""
    return f"echo2:job:{job_id}:returned:{lease_id}"


RESEND_MEMORY_S = 900  # how long an answered lease is remembered: above any agent's resend window (its deadline)


def consumer_name(worker_id: int) -> str:
    """The prompt-stream consumer of a worker: its leases are the entries pending under this name."""
    return f"worker-{worker_id}"


def connect(url: str, *, decode_responses: bool = True, socket_timeout: float = 10.0,
            ca_file: str | None = None) -> redis.Redis:
    """A client for ``url``; every call on it times out (no wait without a limit). redis-py's own silent
    retries are off: a command re-sent after its reply was lost must be seen by :class:`ReplayBuffer`, which
    retries itself and then re-reads what such a lost reply may have delivered. A ``rediss://`` URL is TLS, the
    server's certificate checked against ``ca_file`` (default: the system's CAs)."""
    tls = {"ssl_ca_certs": ca_file} if ca_file and url.startswith("rediss://") else {}
    return redis.Redis.from_url(url, decode_responses=decode_responses, socket_timeout=socket_timeout,
                                socket_connect_timeout=min(socket_timeout, 10.0), retry=Retry(NoBackoff(), 0), **tls)


def add_event(client: redis.Redis, event: TimedEvent) -> None:
    """Add ``event`` on its own (one pipelined round trip)."""
    pipe = client.pipeline()
    pipe.zadd(event.key, {event.member: event.at})
    pipe.zremrangebyscore(event.key, "-inf", event.keep_after)
    pipe.expire(event.key, event.ttl_s)
    pipe.execute()


DROPPED_STALE = "dropped_stale_records"
"""The counter of records the learner dropped as stale, counted in Redis with their acknowledgement: a learner
killed after dropping them, before its next checkpoint, still knows they were dropped (not lost) when it resumes."""


class _Retries:
    """What one operation of a :class:`ReplayBuffer` does after a failure: wait and try again through connection
    errors (backoff 0.1 s doubling to 5 s, +-50% jitter) for up to the buffer's ``retry_for_s`` (a refused password
    for ``AUTH_RETRY_S`` at most), and re-create the consumer groups once when a data-losing restart dropped them."""

    def __init__(self, buffer: ReplayBuffer, *, regroup: bool) -> None:
        self.buffer, self.regroup = buffer, regroup
        self.deadline, self.delay, self.failed = time.monotonic() + buffer.retry_for_s, 0.1, False
        self.auth_deadline: float | None = None

    def after(self, err: Exception) -> float | None:
        """Seconds to wait before trying again, or None: create the groups again, then try at once. Raises ``err``
        when it is not worth another try."""
        job_id = self.buffer.job_id
        if isinstance(err, redis.ResponseError):
            if not self.regroup or "NOGROUP" not in str(err):
                raise err
            log.warning("job %s: consumer groups missing (Redis lost its data?); creating them again", job_id)
            self.regroup, self.failed = False, True
            return None
        if isinstance(err, redis.AuthenticationError):
            self.auth_deadline = self.auth_deadline or time.monotonic() + min(self.buffer.retry_for_s, AUTH_RETRY_S)
        left = min(self.deadline, self.auth_deadline or self.deadline) - time.monotonic()
        if left <= 0:
            raise err
        if not self.failed:
            log.warning("job %s: Redis unreachable (%s); retrying for up to %.0f s", job_id, err, left)
        self.failed = True
        wait = min(left, self.delay * random.uniform(0.5, 1.5))
        self.delay = min(self.delay * 2, 5.0)
        return wait

    def succeeded(self) -> None:
        if self.failed:
            self.buffer.reconnects += 1
            log.info("job %s: Redis is back", self.buffer.job_id)


class ReplayBuffer:
    """The streams of one job, over a Redis client (decoded or not: both are handled)."""

    def __init__(self, client: redis.Redis, job_id: int, *, retry_for_s: float = 0.0) -> None:
        """``retry_for_s``: how long one operation keeps retrying through a Redis outage before it raises
        (the learner waits minutes; a site request a few seconds)."""
        self.client, self.job_id, self.retry_for_s = client, job_id, retry_for_s
        self.prompts, self.trajectories = prompts_key(job_id), trajectories_key(job_id)
        self.counters_key, self.delivered_key = counters_key(job_id), delivered_key(job_id)
        self.reconnects = 0  # operations that succeeded only after a connection error: a reader re-reads pending

    def ensure_groups(self) -> None:
        """Create both streams' consumer groups (idempotent); the streams start empty."""
        self._retrying(self._create_groups, regroup=False)

    def _groups(self) -> tuple[tuple[str, str], ...]:
        """(stream, consumer group) of both streams."""
        return (self.prompts, PROMPT_GROUP), (self.trajectories, LEARNER_GROUP)

    def _create_groups(self) -> None:
        for key, group in self._groups():
            try:
                self.client.xgroup_create(key, group, id="0", mkstream=True)
            except redis.ResponseError as err:
                if "BUSYGROUP" not in str(err):
                    raise

    def _retrying(self, op: Callable[[], T], *, regroup: bool = True) -> T:
        """Run ``op``; retry it through connection errors (backoff 0.1 s doubling to 5 s, +-50% jitter) for up
        to ``retry_for_s``, and once after re-creating consumer groups a data-losing restart dropped."""
        retries = _Retries(self, regroup=regroup)
        while True:
            try:
                result = op()
            except (redis.ResponseError, *TRANSIENT) as err:
                wait = retries.after(err)
                if wait is None:
                    self._create_groups()
                else:
                    time.sleep(wait)
                continue
            retries.succeeded()
            return result

    async def _retrying_async(self, op: Callable[[], Awaitable[T]], client: AsyncClient) -> T:
        """:meth:`_retrying` for an operation on the event loop's ``client``: the same retries, waits that leave the
        loop free."""
        retries = _Retries(self, regroup=True)
        while True:
            try:
                result = await op()
            except (redis.ResponseError, *TRANSIENT) as err:
                wait = retries.after(err)
                if wait is None:
                    await self._create_groups_async(client)
                else:
                    await asyncio.sleep(wait)
                continue
            retries.succeeded()
            return result

    async def _create_groups_async(self, client: AsyncClient) -> None:
        for key, group in self._groups():
            try:
                await bounded(client, client.xgroup_create(key, group, id="0", mkstream=True))
            except redis.ResponseError as err:
                if "BUSYGROUP" not in str(err):
                    raise

    # ---- prompts (the learner tops them up) ----------------------------------------------------

    def add_prompts(self, prompts: Iterable[str]) -> int:
        """Append one prompt group per prompt (a fresh group id each); returns how many."""
        fields = [{"group_id": uuid.uuid4().hex[:16], "prompt": prompt} for prompt in prompts]

        def add() -> None:
            pipe = self.client.pipeline()
            for entry in fields:
                pipe.xadd(self.prompts, entry)
            pipe.execute()

        self._retrying(add)
        return len(fields)

    def outstanding(self) -> int:
        """Groups not yet trained: prompts waiting or leased, plus returned groups not yet acknowledged
        (both streams delete what is done, so their lengths count what is not)."""
        def lengths() -> int:
            pipe = self.client.pipeline()
            pipe.xlen(self.prompts)
            pipe.xlen(self.trajectories)
            return sum(pipe.execute())

        return self._retrying(lengths)

    # ---- leases (the site, for a worker) --------------------------------------------------------

    def lease(self, *, worker_id: int, count: int, timeout_s: float) -> list[LeasedPrompt]:
        """Lease up to ``count`` prompt groups to ``worker_id``: expired leases first, then fresh prompts (one
        round trip: the lease script)."""
        args = [PROMPT_GROUP, consumer_name(worker_id), int(timeout_s * 1000), count]
        entries = self._retrying(lambda: script(self.client, LEASE)(keys=[self.prompts], args=args))
        leased = []
        for entry_id, flat in entries:
            fields = dict(zip(flat[::2], flat[1::2], strict=True))
            leased.append(LeasedPrompt(lease_id=text(entry_id), group_id=text(field(fields, "group_id")),
                                       prompt=text(field(fields, "prompt"))))
        return leased

    def renew(self, *, worker_id: int, timeout_s: float, at_most: int = 256) -> int:
        """Start the timeout of ``worker_id``'s unexpired leases again: it is visibly working (a group of it just
        came back), so a lease it took ahead, or the rest of a batch, is not handed to another worker while it
        delivers under load. Expired ones are left to whoever claims them. Returns how many were renewed."""
        args = [PROMPT_GROUP, consumer_name(worker_id), int(timeout_s * 1000), at_most]
        try:
            return int(self._retrying(lambda: script(self.client, RENEW)(keys=[self.prompts], args=args)))
        except redis.ResponseError:  # no consumer group yet: nothing leased
            return 0

    def return_leases(self, *, worker_id: int, lease_id: str | None = None) -> int:
        """Hand every prompt leased to ``worker_id`` (or only ``lease_id``) back at once (it was released or
        reassigned, or cannot answer it): each is claimed by a ``returned`` consumer as if idle for a day, so the
        next lease of any worker takes it without waiting out the lease timeout. A late answer from the old worker
        is refused ("taken"). Returns how many went back; :class:`LeaseError` for a ``lease_id`` that is no lease."""
        low, high = (lease_id, lease_id) if lease_id is not None else ("-", "+")

        def give_back() -> int:
            pending = self.client.xpending_range(self.prompts, PROMPT_GROUP, min=low, max=high, count=10_000,
                                                 consumername=consumer_name(worker_id))
            ids = [p["message_id"] for p in pending]
            if ids:
                self.client.xclaim(self.prompts, PROMPT_GROUP, "returned", 0, ids, idle=86_400_000, justid=True)
            return len(ids)

        try:
            return self._retrying(give_back)
        except redis.ResponseError as err:  # a lease id that is not a stream id
            raise LeaseError(f"lease_id: {lease_id!r} is not a lease ({err})") from None

    def return_group(self, *, worker_id: int, group: TrajectoryGroup, event: TimedEvent | None = None,
                     seal_key: bytes | None = None, remember_s: int = RESEND_MEMORY_S) -> str:
        """Append a validated group for its lease, at most once, and add ``event`` with it (one round trip);
        returns its trajectory stream id. With ``seal_key`` (the site's: ``marketplace.infra.group_seal``) the
        entry carries its ``seal`` (``dataplane.seal``), computed here over the very bytes appended.

        The same group returned again by the same worker within ``remember_s`` of its first return (a resend: the
        reply was lost) returns the stored entry's id again, appends nothing and adds no event (counted as
        ``resent_groups``). Raises :class:`LeaseError` when the lease expired, is another worker's or names another
        group (then ``event`` is not added).
        """
        data = encode_group(group)
        sealed = seal(seal_key, job_id=self.job_id, worker_id=worker_id, lease_id=group.lease_id, data=data) \
            if seal_key is not None else ""
        keys = [self.prompts, self.trajectories, self.counters_key, self.delivered_key,
                returned_key(self.job_id, group.lease_id)]
        args = [group.lease_id, consumer_name(worker_id), group.group_id, data, PROMPT_GROUP,
                len(group.records), group.records[0].prompt, worker_id, sealed, max(1, int(remember_s))]
        if event is not None:
            keys.append(event.key)
            args += [event.member, repr(event.at), repr(event.keep_after), event.ttl_s]
        try:
            result = text(self._retrying(lambda: script(self.client, RETURN_GROUP)(keys=keys, args=args)))
        except redis.ResponseError as err:  # e.g. a lease id that is not a stream id
            raise LeaseError(f"lease_id: {group.lease_id!r} is not a lease ({err})") from None
        if result in RETURN_ERRORS:
            raise LeaseError(return_error(result, group.lease_id))
        return returned(result)

    def submit(self, **request) -> Submitted:
        """A worker's whole request in one round trip (the ``SUBMIT`` script): return ``groups`` (each as
        :meth:`return_group`, with its event), renew the worker's other leases when one was accepted and ``renew``
        (:meth:`renew`), lease ``lease`` more (:meth:`lease`) and, when leasing, set field ``leased`` (or ``starved``:
        none came) of hash ``observed_key`` to ``now``; ``rejected_records`` refused before (by the caller's checks)
        are counted with those refused here. With ``verdict``, the outcome is kept there and a request found kept is
        answered from it (``held``) and runs nothing. Refusals come back per group as :class:`LeaseError` (its
        text: the code; :func:`return_error` words it), never raised. ``request``: :meth:`_submit_call`'s
        arguments."""
        keys, args = self._submit_call(**request)
        status, kept = self._retrying(lambda: script(self.client, SUBMIT)(keys=keys, args=args))
        return kept_outcome(kept, held=text(status) == "held")

    async def submit_async(self, client: AsyncClient, **request) -> Submitted:
        """:meth:`submit` on an event loop's ``client`` (``request``: its arguments): no thread, and retries that
        wait without holding the loop."""
        keys, args = self._submit_call(**request)
        status, kept = await self._retrying_async(lambda: run_script(client, SUBMIT, keys=keys, args=args), client)
        return kept_outcome(kept, held=text(status) == "held")

    def _submit_call(self, *, worker_id: int, groups: list[tuple[TrajectoryGroup, TimedEvent]], lease: int,
                     timeout_s: float, renew: bool, now: float, observed_key: str, observed_ttl_s: int,
                     rejected_records: int = 0, seal_key: bytes | None = None, verdict: KeptVerdict | None = None,
                     remember_s: int = RESEND_MEMORY_S) -> tuple[list, list]:
        """The ``SUBMIT`` script's keys and arguments for :meth:`submit`."""
        keys = [self.prompts, self.trajectories, self.counters_key, self.delivered_key, observed_key,
                verdict.key if verdict else observed_key, verdict.resent_key if verdict else observed_key]
        args: list = [PROMPT_GROUP, consumer_name(worker_id), worker_id, max(1, int(remember_s)), lease,
                      int(timeout_s * 1000), 1 if renew else 0, repr(now), observed_ttl_s, rejected_records,
                      verdict.ttl_s if verdict else 0, verdict.context if verdict else "", len(groups)]
        if verdict is not None and "\n" in verdict.context:
            raise ValueError("a verdict's context is one line")
        for group, event in groups:
            data = encode_group(group)
            sealed = seal(seal_key, job_id=self.job_id, worker_id=worker_id, lease_id=group.lease_id, data=data) \
                if seal_key is not None else ""
            keys += [returned_key(self.job_id, group.lease_id), event.key]
            args += [group.lease_id, group.group_id, data, len(group.records), group.records[0].prompt, sealed,
                     event.member, repr(event.at), repr(event.keep_after), event.ttl_s]
        return keys, args

    # ---- counters and end of job ----------------------------------------------------------------

    def count(self, name: str, amount: int = 1) -> None:
        self._retrying(lambda: self.client.hincrby(self.counters_key, name, amount))

    def counters(self) -> dict[str, int]:
        return {text(k): int(v) for k, v in self._retrying(lambda: self.client.hgetall(self.counters_key)).items()}

    def delivered(self, worker_ids: Iterable[int]) -> dict[int, int]:
        """The groups accepted from each of ``worker_ids`` since the job began (0 for one that delivered none)."""
        ids = list(worker_ids)
        if not ids:
            return {}
        counts = self._retrying(lambda: self.client.hmget(self.delivered_key, [str(w) for w in ids]))
        return {w: int(c) if c is not None else 0 for w, c in zip(ids, counts, strict=True)}

    def drop(self) -> None:
        """Forget a finished job's streams (prompts no one will answer, groups no one will train on)."""
        self._retrying(lambda: self.client.delete(self.prompts, self.trajectories))

    # ---- the learner's reader --------------------------------------------------------------------

    def read(self, consumer: str, *, count: int, block_ms: int) -> list[StoredGroup]:
        """New groups for the learner's ``consumer`` (each delivered once), waiting up to ``block_ms``."""
        reply = self._retrying(lambda: self._read_raw(consumer, ">", count=max(count, 1), block_ms=max(block_ms, 1)))
        return self._parse(reply)

    def read_pending(self, consumer: str) -> list[StoredGroup]:
        """Every group ``consumer`` read and never acknowledged (a crashed learner's), oldest first."""
        out: list[StoredGroup] = []
        last = "0"
        while True:
            reply = self._retrying(lambda last=last: self._read_raw(consumer, last, count=256))
            entries = reply[0][1] if reply else []
            if not entries:
                return out
            out.extend(self._parse(reply))
            last = text(entries[-1][0])

    def _read_raw(self, consumer: str, last: str, *, count: int, block_ms: int | None = None):
        """XREADGROUP with the entries' fields as bytes, whatever the client decodes: a stored group is binary
        (``dataplane.groupcodec``)."""
        block = ["BLOCK", block_ms] if block_ms is not None else []
        return self.client.execute_command("XREADGROUP", "GROUP", LEARNER_GROUP, consumer, "COUNT", count, *block,
                                           "STREAMS", self.trajectories, last, **{NEVER_DECODE: True})

    def ack(self, entry_ids: list[str]) -> None:
        """Acknowledge and delete entries (the stream is a queue, not an archive); repeats are harmless."""
        if entry_ids:
            def ack() -> None:
                pipe = self.client.pipeline()
                pipe.xack(self.trajectories, LEARNER_GROUP, *entry_ids)
                pipe.xdel(self.trajectories, *entry_ids)
                pipe.execute()

            self._retrying(ack)

    def ack_counted(self, sized: list[tuple[str, int]], counter: str) -> int:
        """Acknowledge and delete entries, given with their record counts, and add the records of those not
        acknowledged before to ``counter``, in one step; returns what it added."""
        if not sized:
            return 0
        args = [LEARNER_GROUP, counter, *(x for entry_id, records in sized for x in (entry_id, records))]
        return int(self._retrying(lambda: script(self.client, ACK_COUNTED)(
            keys=[self.trajectories, self.counters_key], args=args)))

    def _parse(self, reply) -> list[StoredGroup]:
        out = []
        for entry_id, fields in (reply[0][1] if reply else []):
            entry_id = text(entry_id)
            if not fields:  # deleted while still pending: nothing to train on, so acknowledge it
                self._retrying(lambda entry_id=entry_id: self.client.xack(self.trajectories, LEARNER_GROUP, entry_id))
                continue
            out.append(stored_entry(entry_id, fields))
        return out
