--[[ Add new jobs to a shard.
Input:
  KEYS[1] meta, KEYS[2] jobs, KEYS[3] payloads, KEYS[4] delayed, KEYS[5] counts, KEYS[6] seq,
  KEYS[7] types, KEYS[8..] ready sets referenced by index below
  ARGV[1] epoch, ARGV[2] now (ms), then per job: id, packed record (its state is ignored), payload, ready key index
          (1-based into KEYS[8..]; the job goes there if run_at <= now, else to delayed)
Output:
  -1 not owner (stale epoch or shard lost)
  otherwise a table with one entry per job: 0 already present (skipped), 1 ready, 2 delayed
]]
--- @include "record"
if not owns(KEYS[1], ARGV[1]) then return -1 end
local now = tonumber(ARGV[2])
local out = {}
for i = 3, #ARGV, 4 do
  local id = ARGV[i]
  if redis.call('HEXISTS', KEYS[2], id) == 1 then
    out[#out + 1] = 0
  else
    local rec = cmsgpack.unpack(ARGV[i + 1])
    rec.s = nil  -- a new job is counted in no state yet
    redis.call('HSET', KEYS[3], id, ARGV[i + 2])
    redis.call('SADD', KEYS[7], rec.t)
    if rec.r <= now then
      set_state(KEYS[5], rec, 'ready')
      redis.call('ZADD', KEYS[7 + tonumber(ARGV[i + 3])], redis.call('INCR', KEYS[6]), id)
      out[#out + 1] = 1
    else
      set_state(KEYS[5], rec, 'delayed')
      redis.call('ZADD', KEYS[4], rec.r, id)
      out[#out + 1] = 2
    end
    save_job(KEYS[2], id, rec)
  end
end
return out
