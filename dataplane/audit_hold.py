"""Held copies of the stream entries that failed an audit, for the site to check the learner's report against
(docs/trust.md "Audits the site checks").

The trajectory stream is a queue, not an archive (``dataplane.replay``): the learner acknowledges *and deletes* an
entry once trained, and a group that fails its audit is dropped (acknowledged and deleted) at once, before the step
report that names it reaches the site. So before the learner drops a failed group it asks Redis to copy that entry,
as the site stored it (lease, worker stamp, data, the site's seal: ``dataplane.seal``), into a key of its own, kept
:data:`HOLD_S` seconds. The copy is made inside Redis by :data:`HOLD` from the stream entry itself: the learner
names entry ids, never content. The site reads the held copy (or the entry, while it is still in the stream) with
:func:`held_entries`, and believes it only under a valid seal (the learner can write into these keys too); an entry
found in neither is *gone* (never held, or held longer ago than :data:`HOLD_S`), and the site counts nothing on it.

Keys of job ``j``: ``echo2:job:j:held:<entry id>``, a hash of the entry's fields, each with its own expiry; and
``echo2:job:j:held_index``, a sorted set of the held entry ids scored by when their copy expires, so a restarted
learner finds them without ``SCAN`` (which its Redis user may not send: it would list every job's keys,
``dataplane.learner_acl``)."""

from __future__ import annotations

import time
from collections.abc import Iterable

from .replay import NEVER_DECODE, trajectories_key
from .replay_scripts import script
from .stored import StoredGroup, stored_entry

HOLD_S = 7 * 86_400  # a report reaches the site within a step; a week covers a learner down for days and its resume

# KEYS: trajectories, the index, then one held key per entry. ARGV: ttl seconds, expiry (Unix s), then the entry ids
# (in KEYS' order from the third). An entry no longer in the stream is skipped (nothing to copy); one held already
# keeps its copy, its expiry renewed. The index forgets what expired before the expiry given, and lives as long.
HOLD = """
local n = 0
for i = 3, #KEYS do
  local entry = redis.call('XRANGE', KEYS[1], ARGV[i], ARGV[i])
  if #entry == 1 then
    if redis.call('EXISTS', KEYS[i]) == 0 then
      redis.call('HSET', KEYS[i], unpack(entry[1][2]))
    end
    redis.call('EXPIRE', KEYS[i], ARGV[1])
    redis.call('ZADD', KEYS[2], ARGV[2], ARGV[i])
    n = n + 1
  end
end
if n > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[2] - ARGV[1])
  redis.call('EXPIRE', KEYS[2], ARGV[1])
end
return n
"""


def held_key(job_id: int, entry_id: str) -> str:
    return f"echo2:job:{job_id}:held:{entry_id}"


def held_index_key(job_id: int) -> str:
    return f"echo2:job:{job_id}:held_index"


def hold(client, job_id: int, entry_ids: Iterable[str], *, ttl_s: int = HOLD_S) -> int:
    """Copy the stream entries ``entry_ids`` of job ``job_id`` aside for ``ttl_s`` seconds (one round trip); returns
    how many were still in the stream to copy."""
    ids = list(dict.fromkeys(entry_ids))
    if not ids:
        return 0
    keys = [trajectories_key(job_id), held_index_key(job_id), *(held_key(job_id, e) for e in ids)]
    return int(script(client, HOLD)(keys=keys, args=[int(ttl_s), int(time.time()) + int(ttl_s), *ids]))


def held_groups(client, job_id: int, entry_ids: Iterable[str]) -> dict[str, StoredGroup]:
    """The groups of ``entry_ids`` as the site stored them: the held copy, else the entry still in the stream (one
    pipelined round trip); an entry in neither (gone) is absent from the result."""
    return {entry_id: stored_entry(entry_id, fields) for entry_id, fields in held_entries(client, job_id,
                                                                                          entry_ids).items()}


def held_entries(client, job_id: int, entry_ids: Iterable[str]) -> dict[str, dict]:
    """The fields of ``entry_ids`` as stored (bytes to bytes, the site's ``seal`` among them: ``dataplane.seal``):
    the held copy, else the entry still in the stream (one pipelined round trip); an entry in neither is absent."""
    ids = list(dict.fromkeys(entry_ids))
    if not ids:
        return {}
    pipe = client.pipeline(transaction=False)  # NEVER_DECODE holds outside MULTI/EXEC alone
    for entry_id in ids:
        pipe.execute_command("HGETALL", held_key(job_id, entry_id), **{NEVER_DECODE: True})
        pipe.execute_command("XRANGE", trajectories_key(job_id), entry_id, entry_id, **{NEVER_DECODE: True})
    replies = pipe.execute()
    out: dict[str, dict] = {}
    for entry_id, held, live in zip(ids, replies[::2], replies[1::2], strict=True):
        fields = _as_dict(held) if held else (_as_dict(live[0][1]) if live else None)
        if fields:
            out[entry_id] = fields
    return out


def _as_dict(fields) -> dict:
    """A hash or an entry's fields (a dict, or the flat list RESP2 gives) as a dict of bytes."""
    if isinstance(fields, dict):
        return dict(fields)
    return dict(zip(fields[::2], fields[1::2], strict=True))


def held_workers(client, job_id: int) -> dict[str, int]:
    """Every entry of job ``job_id`` held now, with the worker the site accepted it from (the job's index of held
    entries, read once by a restarted learner: learner/audit_probation.py)."""
    ids = [e.decode() if isinstance(e, bytes) else e
           for e in client.zrangebyscore(held_index_key(job_id), int(time.time()), "+inf")]
    if not ids:
        return {}
    pipe = client.pipeline(transaction=False)
    for entry_id in ids:
        pipe.hget(held_key(job_id, entry_id), "worker_id")
    out = {}
    for entry_id, worker in zip(ids, pipe.execute(), strict=True):
        worker = worker.decode() if isinstance(worker, bytes) else worker
        if worker is not None and worker.isdigit():
            out[entry_id] = int(worker)
    return out
