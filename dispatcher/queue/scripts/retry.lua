--[[ Nack leased jobs: retry after backoff, or dead-letter.
Input:
  KEYS[1] jobs, KEYS[2] payloads, KEYS[3] leased, KEYS[4] delayed, KEYS[5] counts
  ARGV[1] now (ms), ARGV[2] backoff base (ms), ARGV[3] cap (ms), ARGV[4] jitter, ARGV[5] count expirations (1/0)
  ARGV[6] steady now (ms: the clock of flow control's gates)
  then per nack 6 entries: id, token, final reason ('' = retryable, or not_retryable / no_handler),
       delay override (ms, -1 = backoff), rand in [0, 1), rate limited ('' no, 'limited': the handler
       raised RateLimited, 'hold': and its key, or type without one, waits as long)
Output: per nack 8 entries: outcome (RETRY.STALE: the token does not hold the lease, RETRY.DELAYED,
        RETRY.DEAD or RETRY.CANCELLED), run_at, attempts, failures, expirations, dead reason, times
        rate limited, type ('' when stale)
A rate-limited job goes back after its delay with the attempt not charged: neither a failure nor an
attempt, counted apart (rec.w).
]]
--- @include "record"
--- @include "retry_or_dead"
--- @include "flow"
local tag = flow_tag(KEYS[1], ':jobs')
local steady_now = tonumber(ARGV[6])
local now = tonumber(ARGV[1])
local policy = {base = tonumber(ARGV[2]), cap = tonumber(ARGV[3]), jitter = tonumber(ARGV[4]),
                count_expirations = ARGV[5] == '1'}
local OUTCOME = {[STATE.DELAYED] = RETRY.DELAYED, [STATE.DEAD] = RETRY.DEAD,
                 [STATE.CANCELLED] = RETRY.CANCELLED}
local out = {}
for i = 7, #ARGV, 6 do
  local id, token = ARGV[i], ARGV[i + 1]
  local rec = load_job(KEYS[1], id)
  if holds(rec, token) then
    local limited = ARGV[i + 5]
    local state, run_at, dead_reason
    if limited ~= '' then
      rec.a = rec.a - 1
      rec.w = (rec.w or 0) + 1
      local delay = math.max(tonumber(ARGV[i + 3]), 0)
      if rec.c then
        state, run_at, dead_reason = STATE.CANCELLED, now, ''
      else
        state, run_at, dead_reason = STATE.DELAYED, now + delay, ''
      end
      if limited == 'hold' then flow_hold(tag, rec, steady_now + delay) end
    else
      rec.f = (rec.f or 0) + 1
      local reason = ARGV[i + 2]
      if reason == '' then reason = REASON.HANDLER_ERROR end
      state, run_at, dead_reason = retry_or_dead(rec, now, policy, reason, tonumber(ARGV[i + 3]),
                                                 tonumber(ARGV[i + 4]))
    end
    flow_release(tag, {rec})
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
    out[n + 1] = OUTCOME[state]; out[n + 2] = run_at; out[n + 3] = rec.a; out[n + 4] = rec.f or 0
    out[n + 5] = rec.x or 0; out[n + 6] = dead_reason; out[n + 7] = rec.w or 0; out[n + 8] = rec.t
  else
    local n = #out
    out[n + 1] = RETRY.STALE; out[n + 2] = 0; out[n + 3] = 0; out[n + 4] = 0; out[n + 5] = 0; out[n + 6] = ''; out[n + 7] = 0; out[n + 8] = ''
  end
end
return out
