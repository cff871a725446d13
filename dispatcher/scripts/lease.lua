--[[ Lease ready jobs to one worker, sharing slots between priority classes.
Input:
  KEYS[1] meta, KEYS[2] jobs, KEYS[3] payloads, KEYS[4] leased, KEYS[5] counts, KEYS[6] seq,
  KEYS[7..] ready sets, class-major: class 0 for each of the worker's types, then class 1, then 2
  ARGV[1] epoch, ARGV[2] now (ms), ARGV[3] number of types, ARGV[4] picks: one digit (class) per wanted
          lease, in the order the fairness policy chose, ARGV[5] fallback: '1' when a pick whose class is
          empty falls back to the highest non-empty class, '0' when it is left unfilled (the caller tries
          the worker's other shards first). Within a class the oldest ready job of the types goes first.
  ARGV[6] nonce: random hex from the caller, the unguessable part of this call's tokens
Output:
  -1 not owner
  otherwise a flat table, 12 entries per lease:
    id, token, class, type, attempt, max_attempts, deadline, ttl, idempotency key, run_at, enqueued_at,
    payload
  followed by one last entry: the unfilled picks (a string of class digits, '' when all were filled)
]]
--- @include "record"
if not owns(KEYS[1], ARGV[1]) then return -1 end
local now = tonumber(ARGV[2])
local ntypes = tonumber(ARGV[3])
local picks = ARGV[4]
local empty = {}

local function oldest(class)
  if empty[class] then return nil end
  local best_key, best_id, best_score
  for j = 1, ntypes do
    local key = KEYS[6 + class * ntypes + j]
    local head = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
    if head[1] and (best_score == nil or tonumber(head[2]) < best_score) then
      best_key, best_id, best_score = key, head[1], tonumber(head[2])
    end
  end
  if not best_key then empty[class] = true end
  return best_key, best_id
end

local fallback = ARGV[5] == '1'
local out = {}
local unfilled = {}
for p = 1, #picks do
  local class = tonumber(string.sub(picks, p, p))
  local key, id = oldest(class)
  if not key and fallback then
    for c = 0, 2 do
      key, id = oldest(c)
      if key then class = c; break end
    end
  end
  if not key then
    unfilled[#unfilled + 1] = string.sub(picks, p, p)
    if fallback or (empty[0] and empty[1] and empty[2]) then
      unfilled[#unfilled + 1] = string.sub(picks, p + 1)
      break
    end
  end
  if key then
    redis.call('ZREM', key, id)
    local rec = load_job(KEYS[2], id)
    if rec and rec.s == 'ready' then
      -- epoch (unique after Redis loses data) : serial (unique in the shard) : nonce (unguessable, so
      -- holding a token proves the lease was handed to you)
      local token = ARGV[1] .. ':' .. redis.call('INCR', KEYS[6]) .. ':' .. ARGV[6]
      rec.a = (rec.a or 0) + 1
      rec.k = token
      rec.d = now + rec.l
      set_state(KEYS[5], rec, 'leased')
      save_job(KEYS[2], id, rec)
      redis.call('ZADD', KEYS[4], rec.d, id)
      local k = #out
      out[k + 1] = id; out[k + 2] = token; out[k + 3] = class; out[k + 4] = rec.t
      out[k + 5] = rec.a; out[k + 6] = rec.m; out[k + 7] = rec.d; out[k + 8] = rec.l
      out[k + 9] = rec.i or ''; out[k + 10] = rec.r; out[k + 11] = rec.e
      out[k + 12] = redis.call('HGET', KEYS[3], id) or ''
    end
  end
end
out[#out + 1] = table.concat(unfilled)
return out
