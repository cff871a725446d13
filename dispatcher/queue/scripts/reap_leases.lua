--[[ Expire leases whose deadline has passed: retry after backoff, or dead-letter (reason lease_expired).
Input:
  KEYS[1] meta, KEYS[2] jobs, KEYS[3] payloads, KEYS[4] leased, KEYS[5] delayed, KEYS[6] counts
  ARGV[1] epoch, ARGV[2] now (ms), ARGV[3] limit, ARGV[4] base (ms), ARGV[5] cap (ms), ARGV[6] jitter,
  ARGV[7] count expirations (1/0), ARGV[8] rand in [0, 1), ARGV[9] wall now (ms, default ARGV[2]):
  deadlines are compared with ARGV[2] (the dispatchers' steady clock), the retry's run_at is
  ARGV[9] + backoff (run_at is wall time, like the delayed set's other scores)
Output:
  FENCE.NOT_OWNER
  otherwise {next deadline or -1, then per expired job 8 entries: id, outcome (RETRY.DELAYED,
  RETRY.DEAD or RETRY.CANCELLED), run_at, attempts, failures, expirations, type, times rate limited}
]]
--- @include "record"
--- @include "retry_or_dead"
--- @include "flow"
if not owns(KEYS[1], ARGV[1]) then return FENCE.NOT_OWNER end
local now = tonumber(ARGV[2])
local policy = {base = tonumber(ARGV[4]), cap = tonumber(ARGV[5]), jitter = tonumber(ARGV[6]),
                count_expirations = ARGV[7] == '1'}
local rand = tonumber(ARGV[8])
local wall_now = tonumber(ARGV[9] or ARGV[2])
local OUTCOME = {[STATE.DELAYED] = RETRY.DELAYED, [STATE.DEAD] = RETRY.DEAD,
                 [STATE.CANCELLED] = RETRY.CANCELLED}
local out = {-1}
local ids = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now, 'LIMIT', 0, tonumber(ARGV[3]))
for n, id in ipairs(ids) do
  redis.call('ZREM', KEYS[4], id)
  local rec = load_job(KEYS[2], id)
  if rec and rec.s == STATE.LEASED then
    rec.x = (rec.x or 0) + 1
    flow_release(flow_tag(KEYS[1], ':meta'), {rec})
    local u = (rand + n * 0.6180339887) % 1
    local state, run_at = retry_or_dead(rec, wall_now, policy, REASON.LEASE_EXPIRED, -1, u)
    rec.k = nil
    rec.o = nil
    rec.d = nil
    set_state(KEYS[6], rec, state)
    if state == STATE.DELAYED then
      rec.r = run_at
      redis.call('ZADD', KEYS[5], run_at, id)
    else
      redis.call('HDEL', KEYS[3], id)
      if state == STATE.DEAD then rec.z = REASON.LEASE_EXPIRED end
    end
    save_job(KEYS[2], id, rec)
    local k = #out
    out[k + 1] = id; out[k + 2] = OUTCOME[state]; out[k + 3] = run_at
    out[k + 4] = rec.a; out[k + 5] = rec.f or 0; out[k + 6] = rec.x; out[k + 7] = rec.t
    out[k + 8] = rec.w or 0
  end
end
local head = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
if head[2] then out[1] = tonumber(head[2]) end
return out
