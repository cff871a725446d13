-- The one decision between retry and dead-letter, for nacks and expired leases.
-- rec.f / rec.x are already incremented for this attempt. Returns (state, run_at, reason):
--   STATE.CANCELLED when a cancel was requested while the job ran;
--   STATE.DEAD with reason when it is out of attempts or not retryable;
--   STATE.DELAYED with run_at = now + backoff otherwise.
-- Backoff for retry n (n = failures + counted expirations): min(cap, base * 2^(n-1)) * (1 + jitter * u),
-- u = 2 * rand - 1. A positive override (handler-requested delay) replaces the backoff.
local function retry_or_dead(rec, now, policy, final_reason, override, rand)
  if rec.c then return STATE.CANCELLED, now, '' end
  if final_reason ~= '' and final_reason ~= REASON.HANDLER_ERROR and final_reason ~= REASON.LEASE_EXPIRED then
    return STATE.DEAD, now, final_reason
  end
  local spent = (rec.f or 0)
  if policy.count_expirations then spent = spent + (rec.x or 0) end
  if spent >= rec.m then return STATE.DEAD, now, final_reason end
  local delay
  if override >= 0 then
    delay = override
  else
    delay = math.min(policy.cap, policy.base * 2 ^ (math.max(spent, 1) - 1))
    delay = math.floor(delay * (1 + policy.jitter * (2 * rand - 1)))
  end
  return STATE.DELAYED, now + delay, ''
end
