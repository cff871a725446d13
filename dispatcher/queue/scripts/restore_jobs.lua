--[[ Put jobs back into the working set from the DB: reconciliation after data loss, and dead-letter requeue.
Input:
  KEYS[1] meta, KEYS[2] jobs, KEYS[3] payloads, KEYS[4] delayed, KEYS[5] counts,
  KEYS[6] cancelled-unqueued, KEYS[7] unpushed, KEYS[8] leased
  ARGV[1] epoch, ARGV[2] mode: 'restore' (only jobs Redis does not know and no cancel noted while it
          did not know them) or 'requeue' (also replaces a dead record), ARGV[3] now (steady ms),
          ARGV[4] nonce (random hex: the unguessable part of restored leases' tokens), then per job 4
          entries: id, packed record (state ignored; it becomes delayed at its run_at), payload, the
          deadline of its lease when its row says leased ('' when not)
Output: FENCE.NOT_OWNER; otherwise {jobs put back that were not noted as unpushed, jobs put back
        that were}. A requeue counts every job it puts back in the first.
A restore reads its rows before it runs: a cancel in between finds no record and leaves a note, which
the restore honours (and leaves in place, as enqueue does: the job's push may still be on its way).
A restore drops the unpushed notes of its jobs: each is in Redis now, put back or pushed meanwhile.
A job whose row says leased until a deadline still ahead, of a type with a concurrency limit (of the
type or per key), comes back leased until that deadline under a token no worker holds: its old run
may still be going, and its slot stays taken until the lease would have ended (then the reaper
retries it, as after any lost worker). The limits' running counts are so rebuilt from the DB.
]]
--- @include "record"
--- @include "flow"
if not owns(KEYS[1], ARGV[1]) then return FENCE.NOT_OWNER end
local requeue = ARGV[2] == 'requeue'
local now = tonumber(ARGV[3])
local tag = flow_tag(KEYS[1], ':meta')
local ids = {}
for i = 5, #ARGV, 4 do ids[#ids + 1] = ARGV[i] end
local limited = {}  -- type -> whether a concurrency limit applies to it
local function has_limit(job_type)
  if limited[job_type] == nil then
    local raw = redis.call('HGET', tag .. ':flow', job_type)
    local cfg = raw and cmsgpack.unpack(raw) or {}
    limited[job_type] = cfg.n ~= nil or cfg.kn ~= nil or cfg.ko ~= nil
  end
  return limited[job_type]
end
local cancelled, unpushed = {}, {}
if not requeue and redis.call('EXISTS', KEYS[6]) == 1 then
  cancelled = read_many(KEYS[6], ids, 'ZMSCORE')
end
local notes = not requeue and redis.call('EXISTS', KEYS[7]) == 1
if notes then unpushed = read_many(KEYS[7], ids, 'ZMSCORE') end
local lost, noted = 0, 0
for j, id in ipairs(ids) do
  local i = 4 * j + 1
  local old = load_job(KEYS[2], id)
  if (old == nil and not cancelled[j]) or (requeue and old and old.s == STATE.DEAD) then
    local rec = cmsgpack.unpack(ARGV[i + 1])
    local deadline = tonumber(ARGV[i + 3])
    rec.s = nil
    if not requeue and deadline and deadline > now and has_limit(rec.t) then
      set_state(KEYS[5], rec, STATE.LEASED)
      rec.k = ARGV[1] .. ':restored' .. j .. ':' .. ARGV[4]
      rec.d = deadline
      redis.call('ZADD', KEYS[8], deadline, id)
      if rec.g then redis.call('HINCRBY', krun_key(tag, rec.t), rec.g, 1) end
    else
      set_state(KEYS[5], rec, STATE.DELAYED)
      redis.call('ZADD', KEYS[4], rec.r, id)
    end
    save_job(KEYS[2], id, rec)
    redis.call('HSET', KEYS[3], id, ARGV[i + 2])
    if unpushed[j] then noted = noted + 1 else lost = lost + 1 end
  end
end
if notes then batched('ZREM', KEYS[7], ids) end
return {lost, noted}
