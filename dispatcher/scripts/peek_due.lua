--[[ Read-only: the due delayed jobs and where each would go.
Input:  KEYS[1] delayed, KEYS[2] jobs, KEYS[3] meta; ARGV[1] now (ms), ARGV[2] limit, ARGV[3] epoch
Output: -1 not owner; otherwise a flat table id, type, class, ... (ids whose record is missing are
        reported with type '' and class -1)
]]
if redis.call('HGET', KEYS[3], 'epoch') ~= ARGV[3] then return -1 end
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
local out = {}
for _, id in ipairs(ids) do
  local raw = redis.call('HGET', KEYS[2], id)
  if raw then
    local rec = cmsgpack.unpack(raw)
    out[#out + 1] = id; out[#out + 1] = rec.t; out[#out + 1] = rec.p
  else
    out[#out + 1] = id; out[#out + 1] = ''; out[#out + 1] = -1
  end
end
return out
