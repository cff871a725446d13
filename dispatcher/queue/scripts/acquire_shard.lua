--[[ Take ownership of a shard: a fencing epoch issued by the DB and an ownership lease.
Input:  KEYS[1] meta; ARGV[1] epoch, ARGV[2] owner, ARGV[3] now (ms), ARGV[4] lease until (ms)
Output: {ACQUIRE.ACQUIRED, ''}; {ACQUIRE.ACQUIRED_UNKNOWN, ''} acquired a shard whose meta was missing
        (new, or lost by Redis: reconcile it); {ACQUIRE.STALE_EPOCH, current epoch} the shard already
        has an equal or higher epoch; {ACQUIRE.HELD, owner} another owner holds an unexpired lease on it.
]]
--- @include "codes"
local cur = redis.call('HMGET', KEYS[1], 'epoch', 'owner', 'until')
if cur[1] and tonumber(cur[1]) >= tonumber(ARGV[1]) then return {ACQUIRE.STALE_EPOCH, cur[1]} end
if cur[2] and cur[2] ~= '' and cur[2] ~= ARGV[2] and tonumber(cur[3] or 0) > tonumber(ARGV[3]) then
  return {ACQUIRE.HELD, cur[2]}
end
redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'owner', ARGV[2], 'until', ARGV[4], 'acquired_at', ARGV[3])
if cur[1] then return {ACQUIRE.ACQUIRED, ''} end
return {ACQUIRE.ACQUIRED_UNKNOWN, ''}
