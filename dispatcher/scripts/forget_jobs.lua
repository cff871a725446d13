--[[ Drop finished records once their status is committed to the DB.
Input:  KEYS[1] jobs; ARGV: ids
Output: number removed. A record that is no longer terminal (requeued meanwhile) is kept.
]]
--- @include "record"
local n = 0
for _, id in ipairs(ARGV) do
  local rec = load_job(KEYS[1], id)
  if rec and (rec.s == 'succeeded' or rec.s == 'cancelled' or rec.s == 'dead') then
    redis.call('HDEL', KEYS[1], id)
    n = n + 1
  end
end
return n
