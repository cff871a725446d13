--[[ Read-only: which of these ids have a finished record (succeeded, dead, cancelled) in the shard.
A finished record stays until its status is committed to the DB; one a crashed owner left behind
is how its successor learns the DB row is behind.
Input:  KEYS[1] jobs, KEYS[2] results; ARGV: ids
Output: per finished job 3 entries: id, packed record, result ('' for none)
]]
--- @include "codes"
local out = {}
for _, id in ipairs(ARGV) do
  local raw = redis.call('HGET', KEYS[1], id)
  if raw and TERMINAL[cmsgpack.unpack(raw).s] then
    local n = #out
    out[n + 1] = id
    out[n + 2] = raw
    out[n + 3] = redis.call('HGET', KEYS[2], id) or ''
  end
end
return out
