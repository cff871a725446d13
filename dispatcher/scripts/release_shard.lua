--[[ Give a shard up so its next owner can take it at once (the epoch stays: the next one is higher).
Input:  KEYS[1] meta; ARGV[1] epoch
Output: 1 released; 0 not owned under this epoch
]]
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'owner', '', 'until', 0)
return 1
