--[[ Make delayed jobs (a first run in the future, or a retry's backoff) due now: each one's score in
the delayed set and its record's run_at become `now`, so the shard's promoter moves it to its ready
set as it moves every due job (flow control included).
Input:  KEYS[1] jobs, KEYS[2] delayed; ARGV[1] now (ms), ARGV[2..] ids
Output: the ids made due. A job no longer delayed (promoted, cancelled, leased meanwhile) or already
        due is left as it is.
]]
--- @include "record"
local now = tonumber(ARGV[1])
local ids = {}
for i = 2, #ARGV do ids[#ids + 1] = ARGV[i] end
local raws = read_many(KEYS[1], ids)
local moved = {}
for n, id in ipairs(ids) do
  local rec = raws[n] and cmsgpack.unpack(raws[n])
  local score = rec and rec.s == STATE.DELAYED and redis.call('ZSCORE', KEYS[2], id)
  if score and tonumber(score) > now then
    redis.call('ZADD', KEYS[2], 'XX', now, id)
    rec.r = now
    save_job(KEYS[1], id, rec)
    moved[#moved + 1] = id
  end
end
return moved
