--[[ Lease ready jobs to one worker, sharing slots between priority classes.
Input:
  KEYS[1] meta, KEYS[2] jobs, KEYS[3] payloads, KEYS[4] leased, KEYS[5] counts, KEYS[6] seq,
  KEYS[7..] ready sets, class-major: class 0 for each of the worker's types, then class 1, then 2
  ARGV[1] epoch, ARGV[2] now (ms), ARGV[3] number of types, ARGV[4] picks: one digit (class) per wanted
          lease, in the order the fairness policy chose, ARGV[5] fallback: '1' when a pick whose class is
          empty falls back to the highest non-empty class, '0' when it is left unfilled (the caller tries
          the worker's other shards first). Within a class the oldest ready job of the types goes first.
  ARGV[6] nonce: random hex from the caller, the unguessable part of this call's tokens
  ARGV[7] holder: the id of the worker stream the leases go to ('' or absent: none recorded); the
          clean-up of that stream shortens only the leases it still holds
Output:
  FENCE.NOT_OWNER
  otherwise a flat table, 13 entries per lease:
    id, token, class, type, attempt, max_attempts, deadline, ttl, idempotency key, run_at, enqueued_at,
    payload, headers (the record's msgpack map as it is stored, '' when the job has none)
  followed by one last entry: the unfilled picks (a string of class digits, '' when all were filled)
The ready sets are read a page at a time and written once for the batch, as are the records, the
leased set and the counts.
]]
--- @include "record"
if not owns(KEYS[1], ARGV[1]) then return FENCE.NOT_OWNER end
local now = tonumber(ARGV[2])
local ntypes = tonumber(ARGV[3])
local picks = ARGV[4]
local page = #picks
local holder = ARGV[7] ~= '' and ARGV[7] or nil

-- The heads of the ready sets, read a page at a time; taken members are removed at the end.
local heads = {}  -- key -> {items = {member, score, ...}, pos, offset, done}
local function head(key)
  local h = heads[key]
  if not h then
    h = {items = {}, pos = 1, offset = 0, done = false}
    heads[key] = h
  end
  if h.pos > #h.items and not h.done then
    h.items = redis.call('ZRANGE', key, h.offset, h.offset + page - 1, 'WITHSCORES')
    h.pos = 1
    h.offset = h.offset + #h.items / 2
    h.done = #h.items / 2 < page
  end
  if h.pos > #h.items then return nil end
  return h.items[h.pos], tonumber(h.items[h.pos + 1])
end

local empty = {}
local taken = {}  -- key -> members to remove
local function take_oldest(class)
  if empty[class] then return nil end
  local best_key, best_id, best_score
  for j = 1, ntypes do
    local key = KEYS[6 + class * ntypes + j]
    local id, score = head(key)
    if id and (best_score == nil or score < best_score) then
      best_key, best_id, best_score = key, id, score
    end
  end
  if not best_key then
    empty[class] = true
    return nil
  end
  heads[best_key].pos = heads[best_key].pos + 2
  taken[best_key] = taken[best_key] or {}
  taken[best_key][#taken[best_key] + 1] = best_id
  return best_id, class
end

local fallback = ARGV[5] == '1'
local chosen = {}  -- id, class, id, class, ...
local unfilled = {}
for p = 1, #picks do
  local id, class = take_oldest(tonumber(string.sub(picks, p, p)))
  if not id and fallback then
    for c = 0, 2 do
      id, class = take_oldest(c)
      if id then break end
    end
  end
  if id then
    chosen[#chosen + 1] = id; chosen[#chosen + 1] = class
  else
    unfilled[#unfilled + 1] = string.sub(picks, p, p)
    if fallback or (empty[0] and empty[1] and empty[2]) then
      unfilled[#unfilled + 1] = string.sub(picks, p + 1)
      break
    end
  end
end
for key, members in pairs(taken) do batched('ZREM', key, members) end

local out = {}
if #chosen > 0 then
  local serial = redis.call('INCRBY', KEYS[6], #chosen / 2) - #chosen / 2
  local ids = {}
  for j = 1, #chosen, 2 do ids[#ids + 1] = chosen[j] end
  local raws = read_many(KEYS[2], ids)
  local payloads = read_many(KEYS[3], ids)
  local records, leased = {}, {}
  local granted, grants = {}, {}  -- ids and records
  for n, id in ipairs(ids) do
    local rec = raws[n] and cmsgpack.unpack(raws[n])
    if rec and rec.s == STATE.READY then
      -- epoch (unique after Redis loses data) : serial (unique in the shard) : nonce (unguessable, so
      -- holding a token proves the lease was handed to you)
      local token = ARGV[1] .. ':' .. (serial + n) .. ':' .. ARGV[6]
      rec.a = (rec.a or 0) + 1
      rec.k = token
      rec.o = holder
      rec.d = now + rec.l
      granted[#granted + 1] = id
      grants[#grants + 1] = rec
      leased[#leased + 1] = rec.d; leased[#leased + 1] = id
      local k = #out
      out[k + 1] = id; out[k + 2] = token; out[k + 3] = chosen[2 * n]; out[k + 4] = rec.t
      out[k + 5] = rec.a; out[k + 6] = rec.m; out[k + 7] = rec.d; out[k + 8] = rec.l
      out[k + 9] = rec.i or ''; out[k + 10] = rec.r; out[k + 11] = rec.e
      out[k + 12] = payloads[n] or ''
      out[k + 13] = rec.h and cmsgpack.pack(rec.h) or ''
    end
  end
  set_states(KEYS[5], grants, STATE.READY, STATE.LEASED)
  for n, id in ipairs(granted) do
    records[#records + 1] = id; records[#records + 1] = cmsgpack.pack(grants[n])
  end
  batched('HSET', KEYS[2], records)
  batched('ZADD', KEYS[4], leased)
end
out[#out + 1] = table.concat(unfilled)
return out
