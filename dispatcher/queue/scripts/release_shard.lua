--[[ Give a shard up so its next owner can take it at once (the epoch stays: the next one is higher).
Input:  KEYS[1] meta; ARGV[1] epoch
Output: EPOCH.CURRENT released; EPOCH.CHANGED not owned under this epoch
]]
--- @include "codes"
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return EPOCH.CHANGED end
redis.call('HSET', KEYS[1], 'owner', '', 'until', 0)
return EPOCH.CURRENT
