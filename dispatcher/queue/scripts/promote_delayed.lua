--[[ Move due delayed jobs to their ready sets (FIFO by the order they become ready).
Input:
  KEYS[1] meta, KEYS[2] jobs, KEYS[3] delayed, KEYS[4] counts, KEYS[5] seq, KEYS[6..] ready sets
  ARGV[1] epoch, ARGV[2] now (ms), then pairs: id, ready key index (1-based into KEYS[6..]; 0: drop orphan)
  Each id is re-checked: still delayed, score <= now. Others are skipped.
Output:
  FENCE.NOT_OWNER
  otherwise {promoted count, next due score or -1}
]]
--- @include "record"
--- @include "flow"
if not owns(KEYS[1], ARGV[1]) then return FENCE.NOT_OWNER end
local now = tonumber(ARGV[2])
local promoted = 0
for i = 3, #ARGV, 2 do
  local id = ARGV[i]
  local score = redis.call('ZSCORE', KEYS[3], id)
  if score and tonumber(score) <= now then
    local rec = load_job(KEYS[2], id)
    redis.call('ZREM', KEYS[3], id)
    if rec and rec.s == STATE.DELAYED and tonumber(ARGV[i + 1]) > 0 then
      set_state(KEYS[4], rec, STATE.READY)
      save_job(KEYS[2], id, rec)
      if rec.g then  -- into its key's set: the ready set named is its type's
        flow_add_ready(flow_tag(KEYS[1], ':meta'), rec.t, rec.p, rec.g, {redis.call('INCR', KEYS[5]), id})
      else
        redis.call('ZADD', KEYS[5 + tonumber(ARGV[i + 1])], redis.call('INCR', KEYS[5]), id)
      end
      promoted = promoted + 1
    end
  end
end
local head = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
return {promoted, head[2] and tonumber(head[2]) or -1}
