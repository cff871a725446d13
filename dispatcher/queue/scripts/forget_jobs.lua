--[[ Drop finished records, and the results kept with them, once their status is committed to the DB.
Input:  KEYS[1] jobs, KEYS[2] results; ARGV: ids
Output: number removed. A record that is no longer terminal (requeued meanwhile) is kept.
]]
--- @include "record"
local raws = read_many(KEYS[1], ARGV)
local finished = {}
for n, id in ipairs(ARGV) do
  local rec = raws[n] and cmsgpack.unpack(raws[n])
  if rec and TERMINAL[rec.s] then
    finished[#finished + 1] = id
  end
end
batched('HDEL', KEYS[1], finished)
batched('HDEL', KEYS[2], finished)
return #finished
