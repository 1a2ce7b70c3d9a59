"""The site's side of a job's Redis streams: leasing prompt groups and appending accepted groups.

A lease is one entry of the prompt stream, delivered to the worker's consumer in the ``leases``
group. It stays pending until the worker returns its group; an entry idle for longer than the lease
timeout is claimed by the next worker that asks (XAUTOCLAIM), so no prompt is lost. Returning a
group is one Lua script — check the lease is still this worker's, append the group to the
trajectory stream, acknowledge and delete the prompt — so a group is never accepted twice.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache

import redis
from django.conf import settings

from dataplane import streams


@lru_cache(maxsize=1)
def client() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, decode_responses=True, socket_timeout=10)


def consumer_name(worker_id: int) -> str:
    return f"worker-{worker_id}"


@dataclass(frozen=True)
class LeasedGroup:
    lease_id: str
    group_id: str
    prompt: str


def ensure_groups(job_id: int) -> None:
    """Create both consumer groups (idempotent); the streams start empty."""
    r = client()
    for key, group in ((streams.prompts_key(job_id), streams.PROMPT_GROUP),
                       (streams.trajectories_key(job_id), streams.LEARNER_GROUP)):
        try:
            r.xgroup_create(key, group, id="0", mkstream=True)
        except redis.ResponseError as err:
            if "BUSYGROUP" not in str(err):
                raise


def lease_groups(*, job_id: int, worker_id: int, count: int, timeout_s: float) -> list[LeasedGroup]:
    """Lease up to ``count`` prompt groups: expired leases first, then fresh prompts."""
    r = client()
    key, consumer = streams.prompts_key(job_id), consumer_name(worker_id)
    ensure_groups(job_id)
    entries: list = []
    _, claimed, _ = r.xautoclaim(key, streams.PROMPT_GROUP, consumer, min_idle_time=int(timeout_s * 1000),
                                 start_id="0-0", count=count)
    entries.extend(e for e in claimed if e[1])
    if len(entries) < count:
        fresh = r.xreadgroup(streams.PROMPT_GROUP, consumer, {key: ">"}, count=count - len(entries))
        for _stream, items in fresh or []:
            entries.extend(items)
    return [LeasedGroup(lease_id=eid, group_id=fields["group_id"], prompt=fields["prompt"]) for eid, fields in entries]


# KEYS: prompts, trajectories, counters. ARGV: lease id, consumer, group id, payload, prompt group name.
_SUBMIT = """
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
return id
"""

_SUBMIT_ERRORS = {
    "expired": "lease expired or unknown: its prompt was handed to another worker",
    "taken": "lease belongs to another worker",
    "group": "group_id does not match the leased prompt",
}


class LeaseError(ValueError):
    pass


def submit_group(*, job_id: int, worker_id: int, lease_id: str, group_id: str, records: list[dict]) -> str:
    """Append one validated group for ``lease_id``; returns the trajectory stream id."""
    r = client()
    keys = [streams.prompts_key(job_id), streams.trajectories_key(job_id), streams.counters_key(job_id)]
    args = [lease_id, consumer_name(worker_id), group_id, json.dumps(records), streams.PROMPT_GROUP]
    try:
        result = r.eval(_SUBMIT, len(keys), *keys, *args)
    except redis.ResponseError as err:  # e.g. a malformed stream id
        raise LeaseError(f"lease_id: {lease_id!r} is not a lease ({err})") from None
    if result in _SUBMIT_ERRORS:
        raise LeaseError(_SUBMIT_ERRORS[result])
    return result


def count(job_id: int, name: str, amount: int = 1) -> None:
    client().hincrby(streams.counters_key(job_id), name, amount)


def counters(job_id: int) -> dict[str, int]:
    return {k: int(v) for k, v in client().hgetall(streams.counters_key(job_id)).items()}


def drop_job(job_id: int) -> None:
    """Forget a finished job's streams (prompts no one will answer, records no one will train on)."""
    client().delete(streams.prompts_key(job_id), streams.trajectories_key(job_id))
