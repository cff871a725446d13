--[[ Heartbeat / reclaim: push lease deadlines to now + the job's TTL.
Input:  KEYS[1] jobs, KEYS[2] leased; ARGV[1] now (ms), ARGV[2] holder: the id of the stream that
        reclaims these leases and holds them from now on ('' for a heartbeat: the holder stays),
        then pairs: id, token
Output: per pair: the new deadline, or EXTEND.REJECTED when the token does not hold the lease (stale,
        finished, unknown)
        and -deadline when the job was cancelled while running (the worker should stop it)
]]
--- @include "record"
local now = tonumber(ARGV[1])
local holder = ARGV[2]
local out = {}
for i = 3, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local rec = load_job(KEYS[1], id)
  if holds(rec, token) then
    rec.d = now + rec.l
    if holder ~= '' then rec.o = holder end
    save_job(KEYS[1], id, rec)
    redis.call('ZADD', KEYS[2], rec.d, id)
    out[#out + 1] = rec.c and -rec.d or rec.d
  else
    out[#out + 1] = EXTEND.REJECTED
  end
end
return out
