--[[ Complete leased jobs.
Input:  KEYS[1] jobs, KEYS[2] payloads, KEYS[3] leased, KEYS[4] counts, KEYS[5] results;
        ARGV[1] now (ms), then triples: id, token, result ('' for none)
Output: per triple 6 entries: ACK.SUCCEEDED (or ACK.STALE: the token does not hold the lease),
        attempts, failures, expirations, type ('' when stale), times rate limited
  The record stays (state succeeded), and its result with it, until the status is committed to the DB,
  then forget_jobs removes both: a successor that finds the record unrecorded records the result too.
  The writes are made once for the batch.
]]
--- @include "record"
--- @include "flow"
local out = {}
local done, acked, records, results, seen = {}, {}, {}, {}, {}
local ids = {}
for i = 2, #ARGV, 3 do ids[#ids + 1] = ARGV[i] end
local raws = read_many(KEYS[1], ids)
for n, id in ipairs(ids) do
  local token = ARGV[3 * n]
  local result = ARGV[3 * n + 1]
  local rec = not seen[id] and raws[n] and cmsgpack.unpack(raws[n])
  if rec and holds(rec, token) then
    seen[id] = true
    rec.k = nil
    rec.o = nil
    done[#done + 1] = id
    acked[#acked + 1] = rec
    if result ~= '' then results[#results + 1] = id; results[#results + 1] = result end
    out[#out + 1] = ACK.SUCCEEDED; out[#out + 1] = rec.a; out[#out + 1] = rec.f or 0; out[#out + 1] = rec.x or 0
    out[#out + 1] = rec.t; out[#out + 1] = rec.w or 0
  else
    out[#out + 1] = ACK.STALE; out[#out + 1] = 0; out[#out + 1] = 0; out[#out + 1] = 0; out[#out + 1] = ''; out[#out + 1] = 0
  end
end
if #done > 0 then
  set_states(KEYS[4], acked, STATE.LEASED, STATE.SUCCEEDED)
  flow_release(flow_tag(KEYS[1], ':jobs'), acked)
  for n, id in ipairs(done) do
    records[#records + 1] = id; records[#records + 1] = cmsgpack.pack(acked[n])
  end
  batched('ZREM', KEYS[3], done)
  batched('HDEL', KEYS[2], done)
  batched('HSET', KEYS[1], records)
  if #results > 0 then batched('HSET', KEYS[5], results) end
end
return out
