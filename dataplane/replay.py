"""The replay buffer: a job's version-tagged storage in Redis streams (paper section 4.1, appendix F).

One module owns every key, consumer group and script, and both the site (leases, returns) and the
learner (prompt top-up, the staleness-gated reader in ``learner.consumer``) use it. ``redis`` is an
optional dependency of this module alone: the agent never imports it (agents never talk to Redis).

Keys of job ``j``:

prompts       ``echo2:job:j:prompts``: stream of prompt groups (fields ``group_id``, ``prompt``). The
              consumer group ``leases`` hands one entry per lease to a worker's consumer; the entry stays
              pending until its group returns, and one idle past the lease timeout is claimed by the next
              worker that asks (XAUTOCLAIM), so no prompt is lost. A released worker's leases are handed
              back at once (``return_leases``).
trajectories  ``echo2:job:j:trajectories``: stream of accepted groups (fields ``lease_id``, ``data``: the
              :class:`~dataplane.records.TrajectoryGroup` as JSON). The consumer group ``learner`` feeds
              the trainer, which acknowledges (and deletes) an entry only once trained or dropped as stale.
counters      ``echo2:job:j:counters``: hash of per-job counters (accepted_groups, accepted_records, ...).

Every operation rides out a Redis restart: a connection error is retried with exponential backoff and
jitter for up to ``retry_for_s`` seconds, and a consumer group lost with the data (a Redis without
persistence) is created again. With AOF (``appendfsync everysec``) a restart loses at most the last second;
without persistence it loses the streams: leased prompts come back from the learner's top-up, and groups not
yet trained are gone (counted by nobody) -- run Redis with AOF.

Returning a group is one Lua script (loaded once, then called by its SHA): check the lease is still
this worker's and names this group, append the group, acknowledge and delete the prompt, count it. So a
group is accepted at most once and a prompt is never lost.
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .records import TrajectoryGroup

log = logging.getLogger("echo2.replay")
T = TypeVar("T")
TRANSIENT = (redis.ConnectionError, redis.TimeoutError)  # a restart, an outage, a server still loading its AOF

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


def consumer_name(worker_id: int) -> str:
    """The prompt-stream consumer of a worker: its leases are the entries pending under this name."""
    return f"worker-{worker_id}"


def connect(url: str, *, decode_responses: bool = True, socket_timeout: float = 10.0) -> redis.Redis:
    """A client for ``url``; every call on it times out (no wait without a limit). redis-py's own silent
    retries are off: a command re-sent after its reply was lost must be seen by :class:`ReplayBuffer`, which
    retries itself and then re-reads what such a lost reply may have delivered."""
    return redis.Redis.from_url(url, decode_responses=decode_responses, socket_timeout=socket_timeout,
                                socket_connect_timeout=min(socket_timeout, 10.0), retry=Retry(NoBackoff(), 0))


class LeaseError(ValueError):
    """A returned group that no open lease of this worker can take; ``str(err)`` is the reason."""


@dataclass(frozen=True)
class LeasedPrompt:
    lease_id: str
    group_id: str
    prompt: str


@dataclass(frozen=True)
class StoredGroup:
    """A group read back from the trajectory stream, with the entry id that acknowledges it."""

    entry_id: str
    group: TrajectoryGroup

    @property
    def records(self):
        return self.group.records

    @property
    def version(self) -> int:
        return self.group.version


# KEYS: prompts, trajectories, counters. ARGV: lease id, consumer, group id, payload, prompt group, records.
_RETURN_GROUP = """
local pending = redis.call('XPENDING', KEYS[1], ARGV[5], ARGV[1], ARGV[1], 1)
if #pending == 0 then return 'expired' end
if pending[1][2] ~= ARGV[2] then return 'taken' end
local entry = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1])
if #entry == 0 then return 'expired' end
local fields = entry[1][2]
local group_id
for i = 1, #fields, 2 do if fields[i] == 'group_id' then group_id = fields[i + 1] end end
if group_id ~= ARGV[3] then return 'group' end
local id = redis.call('XADD', KEYS[2], '*', 'lease_id', ARGV[1], 'data', ARGV[4])
redis.call('XACK', KEYS[1], ARGV[5], ARGV[1])
redis.call('XDEL', KEYS[1], ARGV[1])
redis.call('HINCRBY', KEYS[3], 'accepted_groups', 1)
redis.call('HINCRBY', KEYS[3], 'accepted_records', ARGV[6])
return id
"""

_RETURN_ERRORS = {
    "expired": "lease expired or unknown: its prompt was handed to another worker",
    "taken": "lease belongs to another worker",
    "group": "group_id does not match the leased prompt",
}

_scripts: dict[int, redis.commands.core.Script] = {}


def _return_script(client: redis.Redis):
    """The return script registered on ``client`` once; redis-py calls it by SHA (EVALSHA), loading the
    text only when the server does not know it (after a restart or SCRIPT FLUSH)."""
    script = _scripts.get(id(client))
    if script is None or script.registered_client is not client:
        script = _scripts[id(client)] = client.register_script(_RETURN_GROUP)
    return script


class ReplayBuffer:
    """The streams of one job, over a Redis client (decoded or not: both are handled)."""

    def __init__(self, client: redis.Redis, job_id: int, *, retry_for_s: float = 0.0) -> None:
        """``retry_for_s``: how long one operation keeps retrying through a Redis outage before it raises
        (the learner waits minutes; a site request a few seconds)."""
        self.client, self.job_id, self.retry_for_s = client, job_id, retry_for_s
        self.prompts, self.trajectories = prompts_key(job_id), trajectories_key(job_id)
        self.counters_key = counters_key(job_id)
        self.reconnects = 0  # operations that succeeded only after a connection error: a reader re-reads pending

    def ensure_groups(self) -> None:
        """Create both streams' consumer groups (idempotent); the streams start empty."""
        self._retrying(self._create_groups, regroup=False)

    def _create_groups(self) -> None:
        for key, group in ((self.prompts, PROMPT_GROUP), (self.trajectories, LEARNER_GROUP)):
            try:
                self.client.xgroup_create(key, group, id="0", mkstream=True)
            except redis.ResponseError as err:
                if "BUSYGROUP" not in str(err):
                    raise

    def _retrying(self, op: Callable[[], T], *, regroup: bool = True) -> T:
        """Run ``op``; retry it through connection errors (backoff 0.1 s doubling to 5 s, +-50% jitter) for up
        to ``retry_for_s``, and once after re-creating consumer groups a data-losing restart dropped."""
        deadline, delay, failed = time.monotonic() + self.retry_for_s, 0.1, False
        while True:
            try:
                result = op()
            except redis.ResponseError as err:
                if not regroup or "NOGROUP" not in str(err):
                    raise
                log.warning("job %s: consumer groups missing (Redis lost its data?); creating them again",
                            self.job_id)
                self._create_groups()
                regroup, failed = False, True
                continue
            except TRANSIENT as err:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                if not failed:
                    log.warning("job %s: Redis unreachable (%s); retrying for up to %.0f s", self.job_id, err,
                                left)
                failed = True
                time.sleep(min(left, delay * random.uniform(0.5, 1.5)))
                delay = min(delay * 2, 5.0)
                continue
            if failed:
                self.reconnects += 1
                log.info("job %s: Redis is back", self.job_id)
            return result

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
        """Lease up to ``count`` prompt groups to ``worker_id``: expired leases first, then fresh prompts."""
        consumer = consumer_name(worker_id)
        _, claimed, _ = self._retrying(lambda: self.client.xautoclaim(
            self.prompts, PROMPT_GROUP, consumer, min_idle_time=int(timeout_s * 1000), start_id="0-0", count=count))
        entries = [e for e in claimed if e[1]]
        if len(entries) < count:
            fresh = self._retrying(lambda: self.client.xreadgroup(PROMPT_GROUP, consumer, {self.prompts: ">"},
                                                                  count=count - len(entries)))
            for _stream, items in fresh or []:
                entries.extend(items)
        return [LeasedPrompt(lease_id=_text(eid), group_id=_text(_field(f, "group_id")),
                             prompt=_text(_field(f, "prompt"))) for eid, f in entries]

    def return_leases(self, *, worker_id: int) -> int:
        """Hand every prompt leased to ``worker_id`` back at once (it was released or reassigned): each is
        claimed by a ``returned`` consumer as if idle for a day, so the next lease of any worker takes it
        without waiting out the lease timeout. A late answer from the old worker is refused ("taken")."""
        def give_back() -> int:
            pending = self.client.xpending_range(self.prompts, PROMPT_GROUP, min="-", max="+", count=10_000,
                                                 consumername=consumer_name(worker_id))
            ids = [p["message_id"] for p in pending]
            if ids:
                self.client.xclaim(self.prompts, PROMPT_GROUP, "returned", 0, ids, idle=86_400_000, justid=True)
            return len(ids)

        return self._retrying(give_back)

    def return_group(self, *, worker_id: int, group: TrajectoryGroup) -> str:
        """Append a validated group for its lease, at most once; returns its trajectory stream id.

        Raises :class:`LeaseError` when the lease expired, is another worker's or names another group.
        """
        keys = [self.prompts, self.trajectories, self.counters_key]
        args = [group.lease_id, consumer_name(worker_id), group.group_id, group.model_dump_json(), PROMPT_GROUP,
                len(group.records)]
        try:
            result = _text(self._retrying(lambda: _return_script(self.client)(keys=keys, args=args)))
        except redis.ResponseError as err:  # e.g. a lease id that is not a stream id
            raise LeaseError(f"lease_id: {group.lease_id!r} is not a lease ({err})") from None
        if result in _RETURN_ERRORS:
            raise LeaseError(_RETURN_ERRORS[result])
        return result

    # ---- counters and end of job ----------------------------------------------------------------

    def count(self, name: str, amount: int = 1) -> None:
        self._retrying(lambda: self.client.hincrby(self.counters_key, name, amount))

    def counters(self) -> dict[str, int]:
        return {_text(k): int(v) for k, v in self._retrying(lambda: self.client.hgetall(self.counters_key)).items()}

    def drop(self) -> None:
        """Forget a finished job's streams (prompts no one will answer, groups no one will train on)."""
        self._retrying(lambda: self.client.delete(self.prompts, self.trajectories))

    # ---- the learner's reader --------------------------------------------------------------------

    def read(self, consumer: str, *, count: int, block_ms: int) -> list[StoredGroup]:
        """New groups for the learner's ``consumer`` (each delivered once), waiting up to ``block_ms``."""
        reply = self._retrying(lambda: self.client.xreadgroup(LEARNER_GROUP, consumer, {self.trajectories: ">"},
                                                              count=max(count, 1), block=max(block_ms, 1)))
        return self._parse(reply)

    def read_pending(self, consumer: str) -> list[StoredGroup]:
        """Every group ``consumer`` read and never acknowledged (a crashed learner's), oldest first."""
        out: list[StoredGroup] = []
        last = "0"
        while True:
            reply = self._retrying(lambda last=last: self.client.xreadgroup(
                LEARNER_GROUP, consumer, {self.trajectories: last}, count=256))
            entries = reply[0][1] if reply else []
            if not entries:
                return out
            out.extend(self._parse(reply))
            last = _text(entries[-1][0])

    def ack(self, entry_ids: list[str]) -> None:
        """Acknowledge and delete entries (the stream is a queue, not an archive); repeats are harmless."""
        if entry_ids:
            def ack() -> None:
                pipe = self.client.pipeline()
                pipe.xack(self.trajectories, LEARNER_GROUP, *entry_ids)
                pipe.xdel(self.trajectories, *entry_ids)
                pipe.execute()

            self._retrying(ack)

    def _parse(self, reply) -> list[StoredGroup]:
        out = []
        for entry_id, fields in (reply[0][1] if reply else []):
            entry_id = _text(entry_id)
            if not fields:  # deleted while still pending: nothing to train on, so acknowledge it
                self._retrying(lambda entry_id=entry_id: self.client.xack(self.trajectories, LEARNER_GROUP, entry_id))
                continue
            out.append(StoredGroup(entry_id, TrajectoryGroup.model_validate_json(_field(fields, "data"))))
        return out


def _field(fields: dict, name: str):
    value = fields.get(name)
    return fields.get(name.encode()) if value is None else value


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value
