--[[ Cancel one job.
Input:  KEYS[1] jobs, KEYS[2] payloads, KEYS[3] delayed, KEYS[4] ready set of its type and class,
        KEYS[5] counts, KEYS[6] cancelled-unqueued; ARGV[1] id, ARGV[2] now (ms)
Output: {code, state, token}: CANCEL.NOTED not in Redis, CANCEL.CANCELLED (will never run),
        CANCEL.RUNNING (flagged: it will not be retried; token names the lease to stop),
        CANCEL.FINISHED already terminal (state says which)
A job not in Redis may be committed with its push still on the way (an enqueue is acknowledged at
its commit): it is noted in cancelled-unqueued, which that push and the reconciler's restore honour.
Notes older than an hour go; no push waits that long (one that fails leaves the job to the
reconciler, which reads the row).
]]
--- @include "record"
--- @include "flow"
local id = ARGV[1]
local rec = load_job(KEYS[1], id)
if not rec then
  local now = tonumber(ARGV[2])
  redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', now - 3600000)
  redis.call('ZADD', KEYS[6], now, id)
  return {CANCEL.NOTED, '', ''}
end
if rec.s == STATE.DELAYED or rec.s == STATE.READY then
  redis.call('ZREM', KEYS[3], id)
  redis.call('ZREM', KEYS[4], id)
  if rec.g then  -- its key's ready set; an emptied key leaves the round at the next lease
    redis.call('ZREM', kr_key(flow_tag(KEYS[1], ':jobs'), rec.p, rec.t, rec.g), id)
  end
  redis.call('HDEL', KEYS[2], id)
  set_state(KEYS[5], rec, STATE.CANCELLED)
  save_job(KEYS[1], id, rec)
  return {CANCEL.CANCELLED, STATE.CANCELLED, ''}
end
if rec.s == STATE.LEASED then
  rec.c = 1
  save_job(KEYS[1], id, rec)
  return {CANCEL.RUNNING, STATE.LEASED, rec.k}
end
return {CANCEL.FINISHED, rec.s, ''}
