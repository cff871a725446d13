--[[ Read-only: which of these ids have no record in the shard.
Input:  KEYS[1] jobs; ARGV: ids
Output: the ids that are missing
]]
local out = {}
for _, id in ipairs(ARGV) do
  if redis.call('HEXISTS', KEYS[1], id) == 0 then out[#out + 1] = id end
end
return out
