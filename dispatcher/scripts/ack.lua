--[[ Complete leased jobs.
Input:  KEYS[1] jobs, KEYS[2] payloads, KEYS[3] leased, KEYS[4] counts; ARGV[1] now (ms), then pairs: id, token
Output: per pair 4 entries: ok (1, or 0 for a stale token), attempts, failures, expirations
  The record stays (state succeeded) until the status is committed to the DB, then forget_jobs removes it.
]]
--- @include "record"
local out = {}
for i = 2, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local rec = load_job(KEYS[1], id)
  if holds(rec, token) then
    redis.call('ZREM', KEYS[3], id)
    redis.call('HDEL', KEYS[2], id)
    set_state(KEYS[4], rec, 'succeeded')
    rec.k = nil
    save_job(KEYS[1], id, rec)
    out[#out + 1] = 1; out[#out + 1] = rec.a; out[#out + 1] = rec.f or 0; out[#out + 1] = rec.x or 0
  else
    out[#out + 1] = 0; out[#out + 1] = 0; out[#out + 1] = 0; out[#out + 1] = 0
  end
end
return out
