--[[ Add new jobs to a shard.
Input:
  KEYS[1] meta, KEYS[2] jobs, KEYS[3] payloads, KEYS[4] delayed, KEYS[5] counts, KEYS[6] seq,
  KEYS[7] cancelled-unqueued, KEYS[7 + g] the ready set of group g (its key's, for a group with a
  concurrency key)
  ARGV[1] epoch, ARGV[2] now (ms), ARGV[3] number of groups G, then per group: type, class,
  concurrency key ('' for none);
  then per job: id, packed record (its state already 'ready' when run_at <= now, else 'delayed'),
  payload, group (1-based), run_at (ms)
Output:
  FENCE.NOT_OWNER (stale epoch or shard lost)
  otherwise a table with one entry per job: ENQUEUE.SKIPPED (already present, or cancelled before
  its push arrived: an enqueue is acknowledged once committed, and its id may be cancelled before
  then), ENQUEUE.READY or ENQUEUE.DELAYED
The writes are gathered and made once per batch (one HSET of all records, one ZADD per set, one
count per group and state), which is most of the cost of a large batch.
]]
--- @include "record"
--- @include "flow"
if not owns(KEYS[1], ARGV[1]) then return FENCE.NOT_OWNER end
local now = tonumber(ARGV[2])
local ngroups = tonumber(ARGV[3])
local first = 4 + 3 * ngroups
local out = {}
local records, payloads, delayed = {}, {}, {}
local ready = {}  -- group, id, group, id, ... in arrival order
local added = {}  -- group -> {ready = n, delayed = n}
local ids = {}
for i = first, #ARGV, 5 do ids[#ids + 1] = ARGV[i] end
local present = read_many(KEYS[2], ids)
if redis.call('EXISTS', KEYS[7]) == 1 then
  -- A note stays until it ages out (cancel.lua): a reconcile may read the job's row before the cancel
  -- marks it and restore it after this push, and must find the note too.
  local cancelled = read_many(KEYS[7], ids, 'ZMSCORE')
  for n in ipairs(ids) do
    if cancelled[n] then present[n] = true end
  end
end
local seen = {}
for n, id in ipairs(ids) do
  local i = first + 5 * (n - 1)
  if seen[id] or present[n] then
    out[#out + 1] = ENQUEUE.SKIPPED
  else
    seen[id] = true
    local g = tonumber(ARGV[i + 3])
    local run_at = tonumber(ARGV[i + 4])
    added[g] = added[g] or {ready = 0, delayed = 0}
    records[#records + 1] = id; records[#records + 1] = ARGV[i + 1]
    payloads[#payloads + 1] = id; payloads[#payloads + 1] = ARGV[i + 2]
    if run_at <= now then
      ready[#ready + 1] = g; ready[#ready + 1] = id
      added[g].ready = added[g].ready + 1
      out[#out + 1] = ENQUEUE.READY
    else
      delayed[#delayed + 1] = ARGV[i + 4]; delayed[#delayed + 1] = id
      added[g].delayed = added[g].delayed + 1
      out[#out + 1] = ENQUEUE.DELAYED
    end
  end
end

batched('HSET', KEYS[2], records)
batched('HSET', KEYS[3], payloads)
batched('ZADD', KEYS[4], delayed)
-- Ready scores are the shard's sequence in arrival order (oldest first across a worker's types),
-- reserved once for the batch.
local seq = redis.call('INCRBY', KEYS[6], #ready / 2) - #ready / 2
local scored = {}  -- group -> score, id, ...
for j = 1, #ready, 2 do
  local g = ready[j]
  seq = seq + 1
  scored[g] = scored[g] or {}
  scored[g][#scored[g] + 1] = seq; scored[g][#scored[g] + 1] = ready[j + 1]
end
for g, args in pairs(scored) do
  local key = ARGV[3 + 3 * g]
  if key == '' then
    batched('ZADD', KEYS[7 + g], args)
  else
    flow_add_ready(flow_tag(KEYS[1], ':meta'), ARGV[1 + 3 * g], ARGV[2 + 3 * g], key, args)
  end
end
for g, n in pairs(added) do
  local job_type, class = ARGV[1 + 3 * g], ARGV[2 + 3 * g]
  add_counts(KEYS[5], job_type, class, STATE.READY, n.ready)
  add_counts(KEYS[5], job_type, class, STATE.DELAYED, n.delayed)
end
return out
