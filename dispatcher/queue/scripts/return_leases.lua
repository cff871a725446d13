--[[ Take back leases their worker never received (granted ahead of run_at, the stream ended or the
job was cancelled before the message went out): each job is ready again, as if never leased (the
attempt is not counted); one whose cancel was requested is cancelled. It rejoins its ready set by
the shard's seq like any job becoming ready: scores stay unique across a shard's sets, which the
lease script's oldest-first pick between types relies on (its lead was at most lease_ahead_ms). A
job with a concurrency key goes back to its key's set with the score it left with (rec.q), unique
still: its key's order is what an ordering key (a limit of 1) runs in.
Input:  KEYS[1] jobs, KEYS[2] payloads, KEYS[3] leased, KEYS[4] counts, KEYS[5] seq, KEYS[6..] ready sets
        ARGV: triples id, token, ready key index (1-based into KEYS[6..]: the set of its type and class)
Output: per triple 2 entries: outcome (RETURN.STALE: the token does not hold the lease, RETURN.READY
        again, RETURN.CANCELLED), attempts
]]
--- @include "record"
--- @include "flow"
local tag = flow_tag(KEYS[1], ':jobs')
local out = {}
for i = 1, #ARGV, 3 do
  local id, token = ARGV[i], ARGV[i + 1]
  local rec = load_job(KEYS[1], id)
  if holds(rec, token) then
    redis.call('ZREM', KEYS[3], id)
    rec.k = nil
    rec.o = nil
    rec.d = nil
    rec.a = rec.a - 1
    flow_release(tag, {rec})
    if rec.c then
      set_state(KEYS[4], rec, STATE.CANCELLED)
      redis.call('HDEL', KEYS[2], id)
    else
      set_state(KEYS[4], rec, STATE.READY)
      if rec.g then  -- back to its place in its key's order (an ordering key's jobs run in it)
        flow_add_ready(tag, rec.t, rec.p, rec.g, {rec.q or redis.call('INCR', KEYS[5]), id})
      else
        redis.call('ZADD', KEYS[5 + tonumber(ARGV[i + 2])], redis.call('INCR', KEYS[5]), id)
      end
    end
    save_job(KEYS[1], id, rec)
    out[#out + 1] = rec.c and RETURN.CANCELLED or RETURN.READY
    out[#out + 1] = rec.a
  else
    out[#out + 1] = RETURN.STALE; out[#out + 1] = 0
  end
end
return out
