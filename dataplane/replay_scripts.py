"""The replay buffer's Lua scripts (``dataplane.replay``): a lease, a group's return and a counted acknowledgement,
each one atomic round trip, registered once per client and called by SHA."""

from __future__ import annotations

from typing import Any

# The scripts share these Lua functions (one copy of each rule), prepended to each script's body.

# Lease up to ``count`` prompt groups: expired leases first (XAUTOCLAIM), fresh prompts for the remainder.
_LEASE_SOME = """
local function lease_some(prompts, group, consumer, min_idle_ms, count)
  local out = {}
  local claimed = redis.call('XAUTOCLAIM', prompts, group, consumer, min_idle_ms, '0-0', 'COUNT', count)
  for _, entry in ipairs(claimed[2]) do
    if entry[2] then out[#out + 1] = entry end
  end
  if #out < count then
    local fresh = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', count - #out, 'STREAMS', prompts, '>')
    if fresh then
      for _, entry in ipairs(fresh[1][2]) do out[#out + 1] = entry end
    end
  end
  return out
end
"""

# The consumer's leases not yet expired start their timeout again (XCLAIM to itself, idle 0); an expired one is left
# alone: another worker may be taking it (XAUTOCLAIM), and a renewal must never take it back.
_RENEW_SOME = """
local function renew_some(prompts, group, consumer, timeout_ms, at_most)
  local pending = redis.call('XPENDING', prompts, group, '-', '+', at_most, consumer)
  local renewed = 0
  for _, entry in ipairs(pending) do
    if entry[3] < timeout_ms then
      redis.call('XCLAIM', prompts, group, consumer, 0, entry[1], 'IDLE', 0, 'JUSTID')
      renewed = renewed + 1
    end
  end
  return renewed
end
"""

# One returned group: check the lease is still this worker's and names this group and its prompt, append the group,
# acknowledge and delete the prompt, count it, remember the lease answered (the marker: worker, group, stream id) for
# ``remember_s``, and add the caller's timed event (``ev``: key, member, at, keep after, ttl; nil for none). Returns
# the stream id, 'resent <id>' (the same group sent again by the same worker: its reply was lost), or an error code
# (RETURN_ERRORS). A lease id that is not a stream id is refused before any command, which would fail on it.
# The event is bookkeeping: a key of the wrong type fails it alone (pcall), never the group. Its member is suffixed
# with the milliseconds the lease was held (XPENDING's idle before the XACK), so bills can follow each lease.
_RETURN_ONE = """
local function stream_id(s)
  local ms, seq = string.match(s, '^(%d+)%-(%d+)$')
  if not ms then ms, seq = string.match(s, '^(%d+)$'), '0' end
  return ms ~= nil and #ms <= 19 and #seq <= 19
end

local function return_one(prompts, trajectories, counters, delivered, marker, pgroup, consumer, worker, remember_s,
                          lease, group_id, data, records, prompt, sealed, ev)
  if not stream_id(lease) then return 'badid' end
  local pending = redis.call('XPENDING', prompts, pgroup, lease, lease, 1)
  if #pending == 0 then
    local stored = redis.call('GET', marker)
    local mine = worker .. ' ' .. group_id .. ' '
    if stored and string.sub(stored, 1, #mine) == mine then
      redis.call('HINCRBY', counters, 'resent_groups', 1)
      return 'resent ' .. string.sub(stored, #mine + 1)
    end
    return 'expired'
  end
  if pending[1][2] ~= consumer then return 'taken' end
  local entry = redis.call('XRANGE', prompts, lease, lease)
  if #entry == 0 then return 'expired' end
  local fields = entry[1][2]
  local leased_group, leased_prompt
  for i = 1, #fields, 2 do
    if fields[i] == 'group_id' then leased_group = fields[i + 1]
    elseif fields[i] == 'prompt' then leased_prompt = fields[i + 1] end
  end
  if leased_group ~= group_id then return 'group' end
  if leased_prompt ~= prompt then return 'prompt' end
  local id
  if sealed ~= '' then
    id = redis.call('XADD', trajectories, '*', 'lease_id', lease, 'worker_id', worker, 'data', data, 'seal', sealed)
  else
    id = redis.call('XADD', trajectories, '*', 'lease_id', lease, 'worker_id', worker, 'data', data)
  end
  redis.call('XACK', prompts, pgroup, lease)
  redis.call('XDEL', prompts, lease)
  redis.call('HINCRBY', counters, 'accepted_groups', 1)
  redis.call('HINCRBY', counters, 'accepted_records', records)
  redis.call('HINCRBY', delivered, worker, 1)
  redis.call('SET', marker, worker .. ' ' .. group_id .. ' ' .. id, 'EX', remember_s)
  if ev then
    -- the member gets ':<ms the lease was held>' (since its delivery or last renewal): the span billed for it.
    -- Scored at Redis' clock, the one the idle time was read on: the caller's clock, read before the call,
    -- would date every span early by the round trip (a bill that ends before its lease did)
    local t = redis.call('TIME')
    redis.pcall('ZADD', ev[1], string.format('%d.%06d', t[1], t[2]), ev[2] .. ':' .. pending[1][3])
    redis.pcall('ZREMRANGEBYSCORE', ev[1], '-inf', ev[4])
    redis.pcall('EXPIRE', ev[1], ev[5])
  end
  return id
end
"""

# KEYS: prompts. ARGV: prompt group, consumer, min idle ms, count.
LEASE = _LEASE_SOME + """
return lease_some(KEYS[1], ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]))
"""

# KEYS: prompts, trajectories, counters, delivered, returned marker[, event set].
# ARGV: lease id, consumer, group id, payload, prompt group, records, prompt text, worker id, seal ('' for none),
# marker ttl s[, event member, at, keep after, ttl].
RETURN_GROUP = _RETURN_ONE + """
local ev = nil
if KEYS[6] then ev = {KEYS[6], ARGV[11], ARGV[12], ARGV[13], ARGV[14]} end
return return_one(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], ARGV[5], ARGV[2], ARGV[8], ARGV[10], ARGV[1], ARGV[3],
                  ARGV[4], ARGV[6], ARGV[7], ARGV[9], ev)
"""

# KEYS: prompts. ARGV: prompt group, consumer, lease timeout ms, at most this many.
RENEW = _RENEW_SOME + """
return renew_some(KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]))
"""

SUBMIT_GROUP_ARGS = 10  # ARGV per returned group in SUBMIT

# A whole request of an agent in one round trip: its returned groups (each as RETURN_GROUP), the worker's other
# leases renewed when one was accepted (RENEW), ``lease`` more groups leased (LEASE) with the lease or its absence
# marked in the worker's observed hash (field 'leased' or 'starved' = now), and the outcome kept under the verdict
# key for a resend of the request, which is answered with it (and counted) without running again.
# KEYS: prompts, trajectories, counters, delivered, observed hash (touched only when leasing), verdict, resent counts
#       (both touched only with a verdict ttl > 0), then per group: returned marker, event set.
# ARGV: 1 prompt group, 2 consumer, 3 worker id, 4 marker ttl s, 5 lease count, 6 lease timeout ms, 7 renew (1/0),
#       8 now, 9 observed ttl s, 10 records refused before the script (counted as rejected_records), 11 verdict ttl s
#       (0: keep none), 12 the caller's part of the verdict (no newline), 13 groups; then per group (10): lease id,
#       group id, payload, records, prompt, seal, event member, event at, event keep after, event ttl.
# Returns {'held', kept} or {'new', kept}: kept is the caller's part, a newline, then JSON [returns, leases] (returns:
# one string per group, as return_one; leases: [lease id, group id, prompt] each).
SUBMIT = _LEASE_SOME + _RENEW_SOME + _RETURN_ONE + """
local keep_s = tonumber(ARGV[11])
if keep_s > 0 then
  local held = redis.call('GET', KEYS[6])
  if held then
    redis.call('HINCRBY', KEYS[7], ARGV[3], 1)
    return {'held', held}
  end
end
local refused = {badid = true, expired = true, taken = true, group = true, prompt = true}  -- RETURN_ERRORS
local n = tonumber(ARGV[13])
local returns, rejected, accepted = {}, tonumber(ARGV[10]), 0
for i = 1, n do
  local a = 13 + (i - 1) * 10
  local ev = {KEYS[8 + 2 * (i - 1) + 1], ARGV[a + 7], ARGV[a + 8], ARGV[a + 9], ARGV[a + 10]}
  local r = return_one(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[8 + 2 * (i - 1)], ARGV[1], ARGV[2], ARGV[3], ARGV[4],
                       ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5], ARGV[a + 6], ev)
  returns[i] = r
  if refused[r] then rejected = rejected + tonumber(ARGV[a + 4]) else accepted = accepted + 1 end
end
if rejected > 0 then redis.call('HINCRBY', KEYS[3], 'rejected_records', rejected) end
if accepted > 0 and ARGV[7] == '1' then renew_some(KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[6]), 256) end
local leases = {}
local count = tonumber(ARGV[5])
if count > 0 then
  for _, entry in ipairs(lease_some(KEYS[1], ARGV[1], ARGV[2], ARGV[6], count)) do
    local fields, group_id, prompt = entry[2], '', ''
    for i = 1, #fields, 2 do
      if fields[i] == 'group_id' then group_id = fields[i + 1]
      elseif fields[i] == 'prompt' then prompt = fields[i + 1] end
    end
    leases[#leases + 1] = {entry[1], group_id, prompt}
  end
  redis.pcall('HSET', KEYS[5], #leases > 0 and 'leased' or 'starved', ARGV[8])
  redis.pcall('EXPIRE', KEYS[5], ARGV[9])
end
local kept = ARGV[12] .. '\\n' .. cjson.encode({returns, leases})
if keep_s > 0 then redis.call('SET', KEYS[6], kept, 'EX', keep_s) end
return {'new', kept}
"""

RETURN_ERRORS = {  # SUBMIT lists these codes too
    "badid": "is not a lease",
    "expired": "lease expired or unknown: handed back when its timeout passed or its worker was released",
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
