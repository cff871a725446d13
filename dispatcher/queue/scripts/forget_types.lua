--[[ The type sweep (type_sweep.py): forget the per-type fields of job types that have no job in the
shard, and trim the per-key gates and holds of every type named.
Input:
  KEYS[1] counts, KEYS[2] flow, KEYS[3] keyed, KEYS[4] kvt, KEYS[5] kcfg (the shard's)
  ARGV[1] now (steady ms), ARGV[2] n, ARGV[3..] job types with fields in keyed, kvt or kcfg: the first n
          had no job row and no settings row when the caller looked at the database (to forget if
          Redis agrees), the others are only trimmed
Output: the types forgotten.
Every type named: its keys' gates and holds past their time are dropped (the leases drop them only
while the type has per-key rates or holds: a type whose per-key rate was removed kept them). One of
the first n is then forgotten when, in this one call (nothing else runs between the checks and the deletes):
it has no active job in the shard (no count in any class and active state: its ready, delayed and
leased jobs, and so every per-key set, which holds only keys with such jobs), no settings mirrored
in `flow`, and no key's hold still to come. Its `keyed`, `kvt` and `kcfg` fields go, and its keys'
gates and turn counters. A job of the type arriving after this call starts them afresh: `keyed` is
set again by its first keyed job, the round's turns start from 0 in an empty round, and a `kcfg`
field that is missing makes the first lease weigh the keys against the settings, as after a change.
]]
--- @include "codes"
--- @include "flow"
local counts, flow, keyed, kvt, kcfg = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local now, n = tonumber(ARGV[1]), tonumber(ARGV[2])
local tag = flow_tag(flow, ':flow')
local forgotten = {}
for i = 3, #ARGV do
  local job_type = ARGV[i]
  redis.call('ZREMRANGEBYSCORE', kgate_key(tag, job_type), '-inf', now)
  redis.call('ZREMRANGEBYSCORE', khold_key(tag, job_type), '-inf', now)
  local busy = i > n + 2 or redis.call('HEXISTS', flow, job_type) == 1
      or redis.call('EXISTS', khold_key(tag, job_type)) == 1
  for class = 0, 2 do
    for state in pairs(ACTIVE) do
      busy = busy or redis.call('HEXISTS', counts, job_type .. '|' .. class .. '|' .. state) == 1
    end
  end
  if not busy then
    redis.call('HDEL', keyed, job_type)
    for class = 0, 2 do
      redis.call('HDEL', kvt, class .. ':' .. job_type)
      redis.call('HDEL', kcfg, class .. ':' .. job_type)
      redis.call('DEL', kturn_key(tag, class, job_type))
    end
    redis.call('DEL', kgate_key(tag, job_type))
    forgotten[#forgotten + 1] = job_type
  end
end
return forgotten
