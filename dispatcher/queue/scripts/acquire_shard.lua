--[[ Take ownership of a shard: a fencing epoch issued by the DB and an ownership lease.
Input:  KEYS[1] meta, KEYS[2] jobs, KEYS[3] leased;
        ARGV[1] epoch, ARGV[2] owner, ARGV[3] now (ms), ARGV[4] lease until (ms),
        ARGV[5] the acquiring process's incarnation, ARGV[6] when the leases of a shard taken over
        lapse at the latest (ms; '' leaves them as they are)
Output: {ACQUIRE.ACQUIRED, n}; {ACQUIRE.ACQUIRED_UNKNOWN, 0} acquired a shard whose meta was missing
        (new, or lost by Redis: reconcile it); {ACQUIRE.STALE_EPOCH, current epoch} the shard already
        has an equal or higher epoch; {ACQUIRE.HELD, owner} another owner holds an unexpired lease on it.
        n: leases shortened to ARGV[6].
A shard taken over from another process whose ownership lapsed (it died or froze; a clean release
leaves no owner) may hold leases that never reached their workers: granted just before the owner died.
Those who got theirs reclaim them on reconnecting; the rest must not wait out the job's full lease
TTL, so every lease lapses by ARGV[6] at the latest, as a stream that ended has its leases lapse.
]]
--- @include "record"
local cur = redis.call('HMGET', KEYS[1], 'epoch', 'owner', 'until', 'incarnation')
if cur[1] and tonumber(cur[1]) >= tonumber(ARGV[1]) then return {ACQUIRE.STALE_EPOCH, cur[1]} end
if cur[2] and cur[2] ~= '' and cur[2] ~= ARGV[2] and tonumber(cur[3] or 0) > tonumber(ARGV[3]) then
  return {ACQUIRE.HELD, cur[2]}
end
redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'owner', ARGV[2], 'until', ARGV[4], 'acquired_at', ARGV[3],
  'incarnation', ARGV[5])
if not cur[1] then return {ACQUIRE.ACQUIRED_UNKNOWN, 0} end
local shortened = 0
local taken_over = cur[2] and cur[2] ~= '' and (cur[2] ~= ARGV[2] or cur[4] ~= ARGV[5])
if taken_over and ARGV[6] ~= '' then
  local lapse_at = tonumber(ARGV[6])
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. ARGV[6], '+inf')) do
    local rec = load_job(KEYS[2], id)
    if rec and rec.d and rec.d > lapse_at then
      rec.d = lapse_at
      save_job(KEYS[2], id, rec)
    end
    redis.call('ZADD', KEYS[3], lapse_at, id)
    shortened = shortened + 1
  end
end
return {ACQUIRE.ACQUIRED, shortened}
