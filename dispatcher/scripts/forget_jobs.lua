--[[ Drop finished records once their status is committed to the DB.
Input:  KEYS[1] jobs; ARGV: ids
Output: number removed. A record that is no longer terminal (requeued meanwhile) is kept.
]]
--- @include "record"
local raws = read_many(KEYS[1], ARGV)
local finished = {}
for n, id in ipairs(ARGV) do
  local rec = raws[n] and cmsgpack.unpack(raws[n])
  if rec and (rec.s == 'succeeded' or rec.s == 'cancelled' or rec.s == 'dead') then
    finished[#finished + 1] = id
  end
end
batched('HDEL', KEYS[1], finished)
return #finished
