"""The replay buffer's Lua scripts (``dataplane.replay``): a lease, a group's return and a counted acknowledgement,
each one atomic round trip, registered once per client and called by SHA."""

from __future__ import annotations

from typing import Any

# KEYS: prompts. ARGV: prompt group, consumer, min idle ms, count.
LEASE = """
local count = tonumber(ARGV[4])
local out = {}
local claimed = redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], '0-0', 'COUNT', count)
for _, entry in ipairs(claimed[2]) do
  if entry[2] then out[#out + 1] = entry end
end
if #out < count then
  local fresh = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', count - #out, 'STREAMS', KEYS[1], '>')
  if fresh then
    for _, entry in ipairs(fresh[1][2]) do out[#out + 1] = entry end
  end
end
return out
"""

# KEYS: prompts, trajectories, counters, delivered, returned marker[, event set].
# ARGV: lease id, consumer, group id, payload, prompt group, records, prompt text, worker id, seal ('' for none),
# marker ttl s[, event member, at, keep after, ttl].
# A lease answered is remembered (the marker: worker, group, stream id) for the ttl, so the same group sent again by
# the same worker (its reply was lost, it reconnected) is answered with the stored entry, counted as resent, not
# refused as expired and never appended twice.
RETURN_GROUP = """
local pending = redis.call('XPENDING', KEYS[1], ARGV[5], ARGV[1], ARGV[1], 1)
if #pending == 0 then
  local stored = redis.call('GET', KEYS[5])
  local mine = ARGV[8] .. ' ' .. ARGV[3] .. ' '
  if stored and string.sub(stored, 1, #mine) == mine then
    redis.call('HINCRBY', KEYS[3], 'resent_groups', 1)
    return 'resent ' .. string.sub(stored, #mine + 1)
  end
  return 'expired'
end
if pending[1][2] ~= ARGV[2] then return 'taken' end
local entry = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1])
if #entry == 0 then return 'expired' end
local fields = entry[1][2]
local group_id, prompt
for i = 1, #fields, 2 do
  if fields[i] == 'group_id' then group_id = fields[i + 1] elseif fields[i] == 'prompt' then prompt = fields[i + 1] end
end
if group_id ~= ARGV[3] then return 'group' end
if prompt ~= ARGV[7] then return 'prompt' end
local id
if ARGV[9] ~= '' then
  id = redis.call('XADD', KEYS[2], '*', 'lease_id', ARGV[1], 'worker_id', ARGV[8], 'data', ARGV[4], 'seal', ARGV[9])
else
  id = redis.call('XADD', KEYS[2], '*', 'lease_id', ARGV[1], 'worker_id', ARGV[8], 'data', ARGV[4])
end
redis.call('XACK', KEYS[1], ARGV[5], ARGV[1])
redis.call('XDEL', KEYS[1], ARGV[1])
redis.call('HINCRBY', KEYS[3], 'accepted_groups', 1)
redis.call('HINCRBY', KEYS[3], 'accepted_records', ARGV[6])
redis.call('HINCRBY', KEYS[4], ARGV[8], 1)
redis.call('SET', KEYS[5], ARGV[8] .. ' ' .. ARGV[3] .. ' ' .. id, 'EX', ARGV[10])
if KEYS[6] then
  redis.call('ZADD', KEYS[6], ARGV[12], ARGV[11])
  redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', ARGV[13])
  redis.call('EXPIRE', KEYS[6], ARGV[14])
end
return id
"""

# KEYS: prompts. ARGV: prompt group, consumer, lease timeout ms, at most this many.
# The consumer's leases not yet expired start their timeout again (XCLAIM to itself, idle 0); an expired one is left
# alone: another worker may be taking it (XAUTOCLAIM), and a renewal must never take it back.
RENEW = """
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', tonumber(ARGV[4]), ARGV[2])
local renewed = 0
for _, entry in ipairs(pending) do
  if entry[3] < tonumber(ARGV[3]) then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, entry[1], 'IDLE', 0, 'JUSTID')
    renewed = renewed + 1
  end
end
return renewed
"""

RETURN_ERRORS = {
    "expired": "lease expired or unknown: its prompt was handed to another worker",
    "taken": "lease belongs to another worker",
    "group": "group_id does not match the leased prompt",
    "prompt": "prompt: differs from the leased prompt",
}

# KEYS: trajectories, counters. ARGV: learner group, counter, then entry id and records per entry.
# Only an entry this call acknowledges is counted, so a retry after a lost reply counts nothing twice.
ACK_COUNTED = """
local n = 0
for i = 3, #ARGV - 1, 2 do
  if redis.call('XACK', KEYS[1], ARGV[1], ARGV[i]) == 1 then n = n + tonumber(ARGV[i + 1]) end
  redis.call('XDEL', KEYS[1], ARGV[i])
end
if n > 0 then redis.call('HINCRBY', KEYS[2], ARGV[2], n) end
return n
"""

_scripts: dict[tuple[int, str], Any] = {}


def script(client: Any, text: str):
    """Script ``text`` registered on ``client`` (a redis-py client: this module imports no redis, which is
    ``dataplane.replay``'s dependency alone) once; redis-py calls it by SHA (EVALSHA), loading the
    text only when the server does not know it (after a restart or SCRIPT FLUSH)."""
    script = _scripts.get((id(client), text))
    if script is None or script.registered_client is not client:
        script = _scripts[(id(client), text)] = client.register_script(text)
    return script
