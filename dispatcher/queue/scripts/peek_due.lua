--[[ Read-only: the delayed jobs to promote next and where each would go.
Input:  KEYS[1] delayed, KEYS[2] jobs, KEYS[3] meta;
        ARGV[1] now (ms), ARGV[2] limit, ARGV[3] epoch, ARGV[4] look-ahead (ms)
Lists the jobs due by now; when none is, those due at the earliest run_at if it is within the
look-ahead (so the promoter can wait for that instant with the list in hand).
Output: FENCE.NOT_OWNER; otherwise {at, id, type, class, id, type, class, ...}: `at` the instant the
        listed jobs are due by (PEEK.NONE: nothing delayed; with no jobs listed, the earliest run_at,
        beyond the look-ahead). Ids whose record is missing are listed with type '' and class PEEK.NONE.
]]
--- @include "codes"
if redis.call('HGET', KEYS[3], 'epoch') ~= ARGV[3] then return FENCE.NOT_OWNER end
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if not head[2] then return {PEEK.NONE} end
local now = tonumber(ARGV[1])
local at = math.max(now, tonumber(head[2]))
if at > now + tonumber(ARGV[4]) then return {at} end
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', at, 'LIMIT', 0, tonumber(ARGV[2]))
local out = {at}
for _, id in ipairs(ids) do
  local raw = redis.call('HGET', KEYS[2], id)
  if raw then
    local rec = cmsgpack.unpack(raw)
    out[#out + 1] = id; out[#out + 1] = rec.t; out[#out + 1] = rec.p
  else
    out[#out + 1] = id; out[#out + 1] = ''; out[#out + 1] = PEEK.NONE
  end
end
return out
