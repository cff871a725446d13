--[[ Take ownership of a shard with a fencing epoch issued by the DB.
Input:  KEYS[1] meta; ARGV[1] epoch, ARGV[2] owner, ARGV[3] now (ms)
Output: {0, ''} acquired; {-1, current epoch} when the shard already has an equal or higher epoch.
        {1, ''} acquired a shard whose meta was missing (new, or lost by Redis: reconcile it).
]]
local current = redis.call('HGET', KEYS[1], 'epoch')
if current and tonumber(current) >= tonumber(ARGV[1]) then return {-1, current} end
redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'owner', ARGV[2], 'acquired_at', ARGV[3])
if current then return {0, ''} end
return {1, ''}
