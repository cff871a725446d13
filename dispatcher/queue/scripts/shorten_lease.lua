--[[ A worker's stream ended: let the leases it still holds expire at `until` unless the worker
reconnects and reclaims them. A lease its worker reclaimed on another stream meanwhile (here or on
another dispatcher) has that stream as its holder and keeps its deadline; so does one whose token no
longer holds. A lease with no recorded holder goes by its token alone.
Input:  KEYS[1] jobs, KEYS[2] leased; ARGV[1] until (ms), ARGV[2] the ended stream's id, then pairs: id, token
Output: number of leases shortened
]]
--- @include "record"
local deadline = tonumber(ARGV[1])
local stream = ARGV[2]
local n = 0
for i = 3, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local rec = load_job(KEYS[1], id)
  if holds(rec, token) and (rec.o == nil or rec.o == stream) and rec.d > deadline then
    rec.d = deadline
    save_job(KEYS[1], id, rec)
    redis.call('ZADD', KEYS[2], deadline, id)
    n = n + 1
  end
end
return n
