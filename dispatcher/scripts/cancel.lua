--[[ Cancel one job.
Input:  KEYS[1] jobs, KEYS[2] payloads, KEYS[3] delayed, KEYS[4] ready set of its type and class,
        KEYS[5] counts; ARGV[1] id
Output: {code, state, token}: code 0 not in Redis, 1 cancelled (will never run), 2 running (flagged:
        it will not be retried; token names the lease to stop), 3 already terminal (state says which)
]]
--- @include "record"
local id = ARGV[1]
local rec = load_job(KEYS[1], id)
if not rec then return {0, '', ''} end
if rec.s == 'delayed' or rec.s == 'ready' then
  redis.call('ZREM', KEYS[3], id)
  redis.call('ZREM', KEYS[4], id)
  redis.call('HDEL', KEYS[2], id)
  set_state(KEYS[5], rec, 'cancelled')
  save_job(KEYS[1], id, rec)
  return {1, 'cancelled', ''}
end
if rec.s == 'leased' then
  rec.c = 1
  save_job(KEYS[1], id, rec)
  return {2, 'leased', rec.k}
end
return {3, rec.s, ''}
