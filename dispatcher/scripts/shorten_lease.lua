--[[ A worker's stream dropped: let its leases expire at `until` unless it reconnects and reclaims them.
Input:  KEYS[1] jobs, KEYS[2] leased; ARGV[1] until (ms), then pairs: id, token
Output: number of leases shortened
]]
--- @include "record"
local deadline = tonumber(ARGV[1])
local n = 0
for i = 2, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local rec = load_job(KEYS[1], id)
  if holds(rec, token) and rec.d > deadline then
    rec.d = deadline
    save_job(KEYS[1], id, rec)
    redis.call('ZADD', KEYS[2], deadline, id)
    n = n + 1
  end
end
return n
