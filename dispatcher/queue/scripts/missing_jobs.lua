--[[ Read-only: which of these ids have no record in the shard, and whether a process noted each of
those as committed but not pushed (note_unpushed.lua).
Input:  KEYS[1] jobs, KEYS[2] unpushed; ARGV: ids
Output: two entries per missing id: the id, 1 if noted as unpushed else 0
]]
--- @include "record"
local missing = {}
for _, id in ipairs(ARGV) do
  if redis.call('HEXISTS', KEYS[1], id) == 0 then missing[#missing + 1] = id end
end
local noted = {}
if #missing > 0 and redis.call('EXISTS', KEYS[2]) == 1 then
  noted = read_many(KEYS[2], missing, 'ZMSCORE')
end
local out = {}
for n, id in ipairs(missing) do
  out[#out + 1] = id
  out[#out + 1] = noted[n] and 1 or 0
end
return out
