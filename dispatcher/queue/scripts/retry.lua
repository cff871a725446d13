--[[ Nack leased jobs: retry after backoff, or dead-letter.
Input:
  KEYS[1] jobs, KEYS[2] payloads, KEYS[3] leased, KEYS[4] delayed, KEYS[5] counts
  ARGV[1] now (ms), ARGV[2] backoff base (ms), ARGV[3] cap (ms), ARGV[4] jitter, ARGV[5] count expirations (1/0)
  then per nack 5 entries: id, token, final reason ('' = retryable, or not_retryable / no_handler),
       delay override (ms, -1 = backoff), rand in [0, 1)
Output: per nack 6 entries: outcome (RETRY.STALE: the token does not hold the lease, RETRY.DELAYED,
        RETRY.DEAD or RETRY.CANCELLED), run_at, attempts, failures, expirations, dead reason
]]
--- @include "record"
--- @include "retry_or_dead"
local now = tonumber(ARGV[1])
local policy = {base = tonumber(ARGV[2]), cap = tonumber(ARGV[3]), jitter = tonumber(ARGV[4]),
                count_expirations = ARGV[5] == '1'}
local OUTCOME = {[STATE.DELAYED] = RETRY.DELAYED, [STATE.DEAD] = RETRY.DEAD,
                 [STATE.CANCELLED] = RETRY.CANCELLED}
local out = {}
for i = 6, #ARGV, 5 do
  local id, token = ARGV[i], ARGV[i + 1]
  local rec = load_job(KEYS[1], id)
  if holds(rec, token) then
    rec.f = (rec.f or 0) + 1
    local reason = ARGV[i + 2]
    if reason == '' then reason = REASON.HANDLER_ERROR end
    local state, run_at, dead_reason = retry_or_dead(rec, now, policy, reason, tonumber(ARGV[i + 3]),
                                                     tonumber(ARGV[i + 4]))
    redis.call('ZREM', KEYS[3], id)
    rec.k = nil
    rec.o = nil
    rec.d = nil
    set_state(KEYS[5], rec, state)
    if state == STATE.DELAYED then
      rec.r = run_at
      redis.call('ZADD', KEYS[4], run_at, id)
    else
      redis.call('HDEL', KEYS[2], id)
      if state == STATE.DEAD then rec.z = dead_reason end
    end
    save_job(KEYS[1], id, rec)
    local n = #out
    out[n + 1] = OUTCOME[state]; out[n + 2] = run_at; out[n + 3] = rec.a; out[n + 4] = rec.f
    out[n + 5] = rec.x or 0; out[n + 6] = dead_reason
  else
    local n = #out
    out[n + 1] = RETRY.STALE; out[n + 2] = 0; out[n + 3] = 0; out[n + 4] = 0; out[n + 5] = 0; out[n + 6] = ''
  end
end
return out
