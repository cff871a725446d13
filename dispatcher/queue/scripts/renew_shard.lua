--[[ Extend the ownership lease of a shard this caller still owns.
Input:  KEYS[1] meta; ARGV[1] epoch, ARGV[2] lease until (ms)
Output: EPOCH.CURRENT renewed; EPOCH.CHANGED the epoch changed (the shard was taken over, or Redis lost it)
]]
--- @include "codes"
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return EPOCH.CHANGED end
redis.call('HSET', KEYS[1], 'until', ARGV[2])
return EPOCH.CURRENT
