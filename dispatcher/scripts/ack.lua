--[[ Complete leased jobs.
Input:  KEYS[1] jobs, KEYS[2] payloads, KEYS[3] leased, KEYS[4] counts, KEYS[5] results;
        ARGV[1] now (ms), then triples: id, token, result ('' for none)
Output: per triple 4 entries: ok (1, or 0 for a stale token), attempts, failures, expirations
  The record stays (state succeeded), and its result with it, until the status is committed to the DB,
  then forget_jobs removes both: a successor that finds the record unrecorded records the result too.
  The writes are made once for the batch.
]]
--- @include "record"
local out = {}
local done, records, results, seen = {}, {}, {}, {}
local ended = {}  -- type -> class -> leases that ended
local ids = {}
for i = 2, #ARGV, 3 do ids[#ids + 1] = ARGV[i] end
local raws = read_many(KEYS[1], ids)
for n, id in ipairs(ids) do
  local token = ARGV[3 * n]
  local result = ARGV[3 * n + 1]
  local rec = not seen[id] and raws[n] and cmsgpack.unpack(raws[n])
  if rec and holds(rec, token) then
    seen[id] = true
    ended[rec.t] = ended[rec.t] or {}
    ended[rec.t][rec.p] = (ended[rec.t][rec.p] or 0) + 1
    rec.s = 'succeeded'
    rec.k = nil
    rec.o = nil
    done[#done + 1] = id
    records[#records + 1] = id; records[#records + 1] = cmsgpack.pack(rec)
    if result ~= '' then results[#results + 1] = id; results[#results + 1] = result end
    out[#out + 1] = 1; out[#out + 1] = rec.a; out[#out + 1] = rec.f or 0; out[#out + 1] = rec.x or 0
  else
    out[#out + 1] = 0; out[#out + 1] = 0; out[#out + 1] = 0; out[#out + 1] = 0
  end
end
if #done > 0 then
  batched('ZREM', KEYS[3], done)
  batched('HDEL', KEYS[2], done)
  batched('HSET', KEYS[1], records)
  if #results > 0 then batched('HSET', KEYS[5], results) end
  for job_type, classes in pairs(ended) do
    for class, n in pairs(classes) do add_counts(KEYS[4], job_type, class, 'leased', -n) end
  end
end
return out
