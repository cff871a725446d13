--[[ Put jobs back into the working set from the DB: reconciliation after data loss, and dead-letter requeue.
Input:
  KEYS[1] meta, KEYS[2] jobs, KEYS[3] payloads, KEYS[4] delayed, KEYS[5] counts, KEYS[6] types
  ARGV[1] epoch, ARGV[2] mode: 'restore' (only jobs Redis does not know) or 'requeue' (also replaces a
          dead record), then per job 3 entries: id, packed record (state ignored; it becomes delayed at
          its run_at), payload
Output: FENCE.NOT_OWNER; otherwise the number of jobs put back
]]
--- @include "record"
if not owns(KEYS[1], ARGV[1]) then return FENCE.NOT_OWNER end
local requeue = ARGV[2] == 'requeue'
local n = 0
for i = 3, #ARGV, 3 do
  local id = ARGV[i]
  local old = load_job(KEYS[2], id)
  if old == nil or (requeue and old.s == STATE.DEAD) then
    local rec = cmsgpack.unpack(ARGV[i + 1])
    rec.s = nil
    set_state(KEYS[5], rec, STATE.DELAYED)
    save_job(KEYS[2], id, rec)
    redis.call('HSET', KEYS[3], id, ARGV[i + 2])
    redis.call('ZADD', KEYS[4], rec.r, id)
    redis.call('SADD', KEYS[6], rec.t)
    n = n + 1
  end
end
return n
