--[[ Put jobs back into the working set from the DB: reconciliation after data loss, and dead-letter requeue.
Input:
  KEYS[1] meta, KEYS[2] jobs, KEYS[3] payloads, KEYS[4] delayed, KEYS[5] counts, KEYS[6] types,
  KEYS[7] cancelled-unqueued, KEYS[8] unpushed
  ARGV[1] epoch, ARGV[2] mode: 'restore' (only jobs Redis does not know and no cancel noted while it
          did not know them) or 'requeue' (also replaces a dead record), then per job 3 entries: id,
          packed record (state ignored; it becomes delayed at its run_at), payload
Output: FENCE.NOT_OWNER; otherwise {jobs put back that were not noted as unpushed, jobs put back
        that were}. A requeue counts every job it puts back in the first.
A restore reads its rows before it runs: a cancel in between finds no record and leaves a note, which
the restore honours (and leaves in place, as enqueue does: the job's push may still be on its way).
A restore drops the unpushed notes of its jobs: each is in Redis now, put back or pushed meanwhile.
]]
--- @include "record"
if not owns(KEYS[1], ARGV[1]) then return FENCE.NOT_OWNER end
local requeue = ARGV[2] == 'requeue'
local ids = {}
for i = 3, #ARGV, 3 do ids[#ids + 1] = ARGV[i] end
local cancelled, unpushed = {}, {}
if not requeue and redis.call('EXISTS', KEYS[7]) == 1 then
  cancelled = read_many(KEYS[7], ids, 'ZMSCORE')
end
local notes = not requeue and redis.call('EXISTS', KEYS[8]) == 1
if notes then unpushed = read_many(KEYS[8], ids, 'ZMSCORE') end
local lost, noted = 0, 0
for j, id in ipairs(ids) do
  local i = 3 * j
  local old = load_job(KEYS[2], id)
  if (old == nil and not cancelled[j]) or (requeue and old and old.s == STATE.DEAD) then
    local rec = cmsgpack.unpack(ARGV[i + 1])
    rec.s = nil
    set_state(KEYS[5], rec, STATE.DELAYED)
    save_job(KEYS[2], id, rec)
    redis.call('HSET', KEYS[3], id, ARGV[i + 2])
    redis.call('ZADD', KEYS[4], rec.r, id)
    redis.call('SADD', KEYS[6], rec.t)
    if unpushed[j] then noted = noted + 1 else lost = lost + 1 end
  end
end
if notes then batched('ZREM', KEYS[8], ids) end
return {lost, noted}
