--[[ Lease ready jobs to one worker, sharing slots between priority classes.
Input:
  KEYS[1] meta, KEYS[2] jobs, KEYS[3] payloads, KEYS[4] leased, KEYS[5] counts, KEYS[6] seq,
  KEYS[7..] ready sets, class-major: class 0 for each of the worker's types, then class 1, then 2
  ARGV[1] epoch, ARGV[2] now (ms), ARGV[3] number of types, ARGV[4] picks: one digit (class) per wanted
          lease, in the order the fairness policy chose, ARGV[5] fallback: '1' when a pick whose class is
          empty falls back to the highest non-empty class, '0' when it is left unfilled (the caller tries
          the worker's other shards first). Within a class the oldest ready job of the types goes first.
  ARGV[6] nonce: random hex from the caller, the unguessable part of this call's tokens
  ARGV[7] holder: the id of the worker stream the leases go to ('' for none recorded); the
          clean-up of that stream shortens only the leases it still holds
  ARGV[8..] the worker's types in this shard, in the order of the ready sets' KEYS
Output:
  FENCE.NOT_OWNER
  otherwise a flat table, 15 entries per lease:
    id, token, class, type, attempt, max_attempts, deadline, ttl, idempotency key, run_at, enqueued_at,
    payload, concurrency key, headers (the record's msgpack map as it is stored, '' when the job has
    none), times rate limited (attempt + this is the lease's run number: a job's attempt history key)
  followed by three last entries: the unfilled picks (a string of class digits, '' when all were
  filled); the instant (steady ms) a queue held back by a rate limit or a hold may lease again (-1:
  none was); and the types held back by flow control, each with why: {type, reason, ...}, reason one
  of paused, concurrency, rate, key_concurrency, key_rate (each pair once per call)
The ready sets are read a page at a time and written once for the batch, as are the records, the
leased set and the counts.

Flow control (flow.py, includes/flow.lua; the layout in docs/architecture.md): a type with settings,
a gate, a hold or keyed jobs is leased only while its class is not paused, its leased jobs are under
its concurrency limit and its rate (and any RateLimited hold: reason 'rate') allows. Its keyed jobs
are leased by turns of their keys, round robin: the key at the head of the round takes a lease, or
as many in a row as its weight, then goes to the back, so keys with ready jobs share leases whatever
their backlog; a key at its limit or waiting for its rate leaves the round until a slot frees
(flow_release) or its time comes (the waiting set). The type's jobs without a key take their turns
as the key ''. Across types and within a key the oldest ready job goes first, as without flow
control.
]]
--- @include "record"
--- @include "flow"
if not owns(KEYS[1], ARGV[1]) then return FENCE.NOT_OWNER end
local now = tonumber(ARGV[2])
local ntypes = tonumber(ARGV[3])
local picks = ARGV[4]
local page = #picks
local holder = ARGV[7] ~= '' and ARGV[7] or nil
local tag = flow_tag(KEYS[1], ':meta')
local KEY_FIRST_PAGE = 2
local types = {}
for j = 1, ntypes do types[j] = ARGV[7 + j] end

-- The heads of the ready sets, read a page at a time; taken members are removed at the end. A key's
-- set is popped instead, a small page first that doubles (a call takes a few jobs of each of many
-- keys, often their only one), and what was popped but not taken goes back at the end.
local heads = {}  -- key -> {items = {member, score, ...}, pos, offset, done, size, popped}
local function head(key, first_page)
  local h = heads[key]
  if not h then
    h = {items = {}, pos = 1, offset = 0, done = false, size = first_page or page, popped = first_page ~= nil}
    heads[key] = h
  end
  if h.pos > #h.items and not h.done then
    if h.popped then
      h.items = redis.call('ZPOPMIN', key, h.size)
    else
      h.items = redis.call('ZRANGE', key, h.offset, h.offset + h.size - 1, 'WITHSCORES')
      h.offset = h.offset + #h.items / 2
    end
    h.pos = 1
    h.done = #h.items / 2 < h.size
    h.size = math.min(2 * h.size, page)
  end
  if h.pos > #h.items then return nil end
  return h.items[h.pos], tonumber(h.items[h.pos + 1])
end

local function ready_key(class, j)
  return KEYS[6 + class * ntypes + j]
end

-- Flow control of the types that have any: nil for the others, which lease as they always did.
local flow = {}
local wake_at = -1
local held = {}  -- 'type|reason' -> true
local function hold_back(j, reason)
  held[types[j] .. '|' .. reason] = true
end
local function wake(at)
  if wake_at < 0 or at < wake_at then wake_at = at end
end
if ntypes > 0 then
  local settings = redis.call('HMGET', tag .. ':flow', unpack(types))
  local keyed = redis.call('HMGET', tag .. ':keyed', unpack(types))
  local gates = redis.call('ZMSCORE', tag .. ':gate', unpack(types))
  local holds = redis.call('ZMSCORE', tag .. ':hold', unpack(types))
  local gated = false
  for j = 1, ntypes do
    gated = gated or gates[j] or holds[j]
    if settings[j] or keyed[j] or gates[j] or holds[j] then
      local cfg = settings[j] and cmsgpack.unpack(settings[j]) or {}
      local interval, tolerance = gcra(cfg.r, cfg.b)
      local key_interval, key_tolerance = gcra(cfg.kr, cfg.kb)
      flow[j] = {
        cfg = cfg, raw = settings[j] or '', keyed = keyed[j] ~= false,
        tat = gate_time(tonumber(gates[j] or 0), interval, tolerance, now), tat_read = tonumber(gates[j] or 0),
        hold = tonumber(holds[j] or 0),
        interval = interval, tolerance = tolerance, key_interval = key_interval, key_tolerance = key_tolerance,
        -- which per-key checks apply: a concurrency limit for some key, a gate (rate or hold)
        key_limited = (cfg.kn or 0) > 0 or cfg.ko ~= nil, key_gated = cfg.kr ~= nil or keyed[j] == KEYED.KEY_GATES,
        allow = nil,  -- leases left under the type's concurrency limit, read when first needed
        running = {}, key_tat = {}, key_hold = {}, key_tat_dirty = {},  -- per key, read a page at a time
        cand = {}, prepared = {}, turn = {}, page = {}, moves = {},  -- per class
      }
    end
  end
  if gated then  -- a gate past its time is no gate: forgotten, so they stay as few as the gated types
    redis.call('ZREMRANGEBYSCORE', tag .. ':gate', '-inf', now)
    redis.call('ZREMRANGEBYSCORE', tag .. ':hold', '-inf', now)
  end
end

-- May type j lease in this class now? (Checks only; type_take spends.)
local function type_open(j, class)
  local f = flow[j]
  local cfg = f.cfg
  if cfg.pause and bit.band(cfg.pause, 2 ^ class) ~= 0 then
    hold_back(j, 'paused')
    return false
  end
  if cfg.n then
    if f.allow == nil then
      local leased = 0
      for c = 0, 2 do
        leased = leased + tonumber(redis.call('HGET', KEYS[5], types[j] .. '|' .. c .. '|' .. STATE.LEASED) or 0)
      end
      f.allow = cfg.n - leased
    end
    if f.allow <= 0 then
      hold_back(j, 'concurrency')
      return false
    end
  end
  local at = math.max(f.interval > 0 and f.tat - f.tolerance or 0, f.hold)
  if at > now then
    hold_back(j, 'rate')
    wake(at)
    return false
  end
  return true
end

local function type_take(j)
  local f = flow[j]
  if f.allow then f.allow = f.allow - 1 end
  if f.interval > 0 then f.tat = math.max(f.tat, now) + f.interval end
end

local function key_running(f, j, key)
  local n = f.running[key]
  if n == nil then
    n = tonumber(redis.call('HGET', krun_key(tag, types[j]), key) or 0)
    f.running[key] = n
  end
  return n
end

-- When the key may lease next by its rate and its hold (steady ms; both read with the page, a stored
-- rate's time as the current rate sees it).
local function key_open_at(f, key)
  local by_rate = f.key_interval > 0 and (f.key_tat[key] or 0) - f.key_tolerance or 0
  return math.max(by_rate, f.key_hold[key] or 0)
end

local function key_limit(cfg, key)
  return (cfg.ko and cfg.ko[key]) or cfg.kn or 0
end

-- The first look at a keyed queue in this call: keys whose rate wait is over rejoin the round, so do
-- keys blocked at their limit when the settings changed since they were blocked, and the type's
-- jobs without a key take part as the key ''.
local function prepare(f, j, class)
  f.prepared[class] = true
  f.moves[class] = {}
  local job_type = types[j]
  local round, waiting = kq_key(tag, class, job_type), kw_key(tag, class, job_type)
  f.turn[class] = tonumber(redis.call('HGET', tag .. ':kvt', class .. ':' .. job_type) or 0)
  local function join(key)
    if not redis.call('ZSCORE', round, key) then
      f.turn[class] = f.turn[class] + 1
      redis.call('ZADD', round, f.turn[class], key)
    end
  end
  local seen_field = class .. ':' .. job_type
  if (redis.call('HGET', tag .. ':kcfg', seen_field) or '') ~= f.raw then
    local blocked = kblocked_key(tag, job_type)
    local masks = redis.call('HGETALL', blocked)
    for i = 1, #masks, 2 do
      local key, classes = masks[i], tonumber(masks[i + 1])
      if bit.band(classes, 2 ^ class) ~= 0 then
        join(key)
        classes = classes - 2 ^ class
        if classes > 0 then redis.call('HSET', blocked, key, classes) else redis.call('HDEL', blocked, key) end
      end
    end
    redis.call('HSET', tag .. ':kcfg', seen_field, f.raw)
    -- and keys waiting for a rate that may have changed: weighed again
    local rated = redis.call('ZRANGE', waiting, 0, -1)
    for _, key in ipairs(rated) do join(key) end
    redis.call('DEL', waiting)
  end
  if f.key_gated then  -- gates and holds past their time are no gates: forgotten
    redis.call('ZREMRANGEBYSCORE', kgate_key(tag, job_type), '-inf', now)
    redis.call('ZREMRANGEBYSCORE', khold_key(tag, job_type), '-inf', now)
  end
  local due = redis.call('ZRANGEBYSCORE', waiting, '-inf', now)
  for _, key in ipairs(due) do join(key) end
  if #due > 0 then batched('ZREM', waiting, due) end
  local next_due = redis.call('ZRANGE', waiting, 0, 0, 'WITHSCORES')
  if next_due[2] then wake(tonumber(next_due[2])) end
  if head(ready_key(class, j)) then join('') end
end

-- Keys that took their turn (to the back: their new turn number) or left the round (false), written
-- once for many turns: before the round is read again, and at the end.
local function flush_moves(f, j, class)
  local moves = f.moves[class]
  if next(moves) == nil then return end
  local back, gone = {}, {}
  for key, turn in pairs(moves) do
    if turn then
      back[#back + 1] = turn; back[#back + 1] = key
    else
      gone[#gone + 1] = key
    end
  end
  local round = kq_key(tag, class, types[j])
  if #back > 0 then batched('ZADD', round, back) end
  if #gone > 0 then batched('ZREM', round, gone) end
  f.moves[class] = {}
end

-- The head of the round, read a page of keys at a time with what their checks need: a key that takes
-- its turn goes to the back or leaves, so the page stays in the round's order until it is used up.
local function round_page(f, j, class)
  local ps = f.page[class]
  if ps and ps.pos <= #ps.items then return ps end
  flush_moves(f, j, class)
  local items = redis.call('ZRANGE', kq_key(tag, class, types[j]), 0, page - 1, 'WITHSCORES')
  ps = {items = items, pos = 1}
  f.page[class] = ps
  local function prefetch(known, source, command, as_read)
    local unknown = {}
    for i = 1, #items, 2 do
      if items[i] ~= '' and known[items[i]] == nil then unknown[#unknown + 1] = items[i] end
    end
    if #unknown > 0 then
      local values = redis.call(command or 'HMGET', source, unpack(unknown))
      for n, key in ipairs(unknown) do
        known[key] = tonumber(values[n] or 0)
        if as_read then known[key] = as_read(known[key]) end
      end
    end
  end
  if f.key_limited then prefetch(f.running, krun_key(tag, types[j])) end
  if f.key_gated then
    prefetch(f.key_tat, kgate_key(tag, types[j]), 'ZMSCORE', function(tat)
      return gate_time(tat, f.key_interval, f.key_tolerance, now)
    end)
    prefetch(f.key_hold, khold_key(tag, types[j]), 'ZMSCORE')
  end
  return ps
end

-- The job a keyed queue offers next: the head of the ready set of the key whose turn it is. Keys
-- that cannot lease now leave the round on the way.
local function keyed_candidate(j, class)
  local f = flow[j]
  local cand = f.cand[class]
  if cand ~= nil then return cand end
  if not f.prepared[class] then prepare(f, j, class) end
  local job_type = types[j]
  local round = kq_key(tag, class, job_type)
  while true do
    local ps = round_page(f, j, class)
    if ps.pos > #ps.items then
      f.cand[class] = false
      return false
    end
    local key, turn = ps.items[ps.pos], tonumber(ps.items[ps.pos + 1])
    local set = key == '' and ready_key(class, j) or kr_key(tag, class, job_type, key)
    local id, score = head(set, KEY_FIRST_PAGE)
    local open = id ~= nil
    if open and key ~= '' then
      local limit = f.key_limited and key_limit(f.cfg, key) or 0
      if limit > 0 and key_running(f, j, key) >= limit then
        open = false  -- back when one of its leases ends (flow_release) or the settings change
        local blocked = kblocked_key(tag, job_type)
        local classes = tonumber(redis.call('HGET', blocked, key) or 0)
        redis.call('HSET', blocked, key, bit.bor(classes, 2 ^ class))
        hold_back(j, 'key_concurrency')
      elseif f.key_gated then
        local at = key_open_at(f, key)
        if at > now then
          open = false
          redis.call('ZADD', kw_key(tag, class, job_type), at, key)
          hold_back(j, 'key_rate')
          wake(at)
        end
      end
    end
    if open then
      cand = {key = key, id = id, score = score, set = set, page = ps}
      f.cand[class] = cand
      return cand
    end
    ps.pos = ps.pos + 2
    f.moves[class][key] = false
    if f.cfg.kw then redis.call('HDEL', kturn_key(tag, class, job_type), key) end
  end
end

local empty = {}
local taken = {}  -- key -> members to remove
local function take(set, id)
  local h = heads[set]
  h.pos = h.pos + 2
  if not h.popped then
    taken[set] = taken[set] or {}
    taken[set][#taken[set] + 1] = id
  end
end

local function take_keyed(j, class, cand)
  local f = flow[j]
  local key = cand.key
  local weight = 1
  if key ~= '' then
    if f.key_limited then f.running[key] = key_running(f, j, key) + 1 end
    if f.key_interval > 0 then
      f.key_tat[key] = math.max(f.key_tat[key] or 0, now) + f.key_interval
      f.key_tat_dirty[key] = true
    end
    weight = (f.cfg.kw and f.cfg.kw[key]) or 1
    -- The key's candidates in the other classes were weighed before this lease: weigh them again.
    for c = 0, 2 do
      if c ~= class and f.cand[c] and f.cand[c].key == key then f.cand[c] = nil end
    end
  end
  local h = heads[cand.set]
  if h.done and h.pos > #h.items then
    -- its last ready job: the key leaves the round (it joins again with its next ready job)
    cand.page.pos = cand.page.pos + 2
    f.moves[class][key] = false
    if weight > 1 then redis.call('HDEL', kturn_key(tag, class, types[j]), key) end
  elseif weight <= 1 or redis.call('HINCRBY', kturn_key(tag, class, types[j]), key, 1) >= weight then
    -- to the back, after as many leases in a row as its weight
    if weight > 1 then redis.call('HDEL', kturn_key(tag, class, types[j]), key) end
    cand.page.pos = cand.page.pos + 2
    f.turn[class] = f.turn[class] + 1
    f.moves[class][key] = f.turn[class]
  end
  f.cand[class] = nil
end

local function take_oldest(class)
  if empty[class] then return nil end
  local best_j, best_id, best_score, best_cand
  for j = 1, ntypes do
    local id, score, cand
    local f = flow[j]
    if not f then
      id, score = head(ready_key(class, j))
    elseif type_open(j, class) then
      if f.keyed then
        cand = keyed_candidate(j, class)
        if cand then id, score = cand.id, cand.score end
      else
        id, score = head(ready_key(class, j))
      end
    end
    if id and (best_score == nil or score < best_score) then
      best_j, best_id, best_score, best_cand = j, id, score, cand
    end
  end
  if not best_j then
    empty[class] = true  -- nothing in it will open later in this call: gates only close
    return nil
  end
  take(best_cand and best_cand.set or ready_key(class, best_j), best_id)
  if flow[best_j] then type_take(best_j) end
  if best_cand then take_keyed(best_j, class, best_cand) end
  return best_id, class, best_score
end

local fallback = ARGV[5] == '1'
local chosen = {}  -- id, class, id, class, ...
local ready_scores = {}  -- per chosen id, its score in its ready set
local unfilled = {}
for p = 1, #picks do
  local id, class, score = take_oldest(tonumber(string.sub(picks, p, p)))
  if not id and fallback then
    for c = 0, 2 do
      id, class, score = take_oldest(c)
      if id then break end
    end
  end
  if id then
    chosen[#chosen + 1] = id; chosen[#chosen + 1] = class
    ready_scores[#ready_scores + 1] = score
  else
    unfilled[#unfilled + 1] = string.sub(picks, p, p)
    if fallback or (empty[0] and empty[1] and empty[2]) then
      unfilled[#unfilled + 1] = string.sub(picks, p + 1)
      break
    end
  end
end
for key, members in pairs(taken) do batched('ZREM', key, members) end
for key, h in pairs(heads) do
  if h.popped and h.pos <= #h.items then
    local back = {}
    for i = h.pos, #h.items, 2 do back[#back + 1] = h.items[i + 1]; back[#back + 1] = h.items[i] end
    batched('ZADD', key, back)
  end
end

local out = {}
if #chosen > 0 then
  local serial = redis.call('INCRBY', KEYS[6], #chosen / 2) - #chosen / 2
  local ids = {}
  for j = 1, #chosen, 2 do ids[#ids + 1] = chosen[j] end
  local raws = read_many(KEYS[2], ids)
  local payloads = read_many(KEYS[3], ids)
  local records, leased = {}, {}
  local granted, grants = {}, {}  -- ids and records
  local keyed = {}  -- type -> key -> leases granted
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
      if rec.g then
        rec.q = ready_scores[n]  -- a lease returned unsent goes back to its place in its key's order
        keyed[rec.t] = keyed[rec.t] or {}
        keyed[rec.t][rec.g] = (keyed[rec.t][rec.g] or 0) + 1
      end
      local k = #out
      out[k + 1] = id; out[k + 2] = token; out[k + 3] = chosen[2 * n]; out[k + 4] = rec.t
      out[k + 5] = rec.a; out[k + 6] = rec.m; out[k + 7] = rec.d; out[k + 8] = rec.l
      out[k + 9] = rec.i or ''; out[k + 10] = rec.r; out[k + 11] = rec.e
      out[k + 12] = payloads[n] or ''; out[k + 13] = rec.g or ''
      out[k + 14] = rec.h and cmsgpack.pack(rec.h) or ''; out[k + 15] = rec.w or 0
    end
  end
  set_states(KEYS[5], grants, STATE.READY, STATE.LEASED)
  for n, id in ipairs(granted) do
    records[#records + 1] = id; records[#records + 1] = cmsgpack.pack(grants[n])
  end
  batched('HSET', KEYS[2], records)
  batched('ZADD', KEYS[4], leased)
  for job_type, keys in pairs(keyed) do
    local names = {}
    for key in pairs(keys) do names[#names + 1] = key end
    local running = read_many(krun_key(tag, job_type), names)
    local counts = {}
    for n, key in ipairs(names) do
      counts[#counts + 1] = key; counts[#counts + 1] = tonumber(running[n] or 0) + keys[key]
    end
    batched('HSET', krun_key(tag, job_type), counts)
  end
end
for j, f in pairs(flow) do
  for class in pairs(f.moves) do flush_moves(f, j, class) end
  if f.tat ~= f.tat_read and f.tat > now then redis.call('ZADD', tag .. ':gate', f.tat, types[j]) end
  local key_tats = {}
  for key in pairs(f.key_tat_dirty) do key_tats[#key_tats + 1] = f.key_tat[key]; key_tats[#key_tats + 1] = key end
  if #key_tats > 0 then batched('ZADD', kgate_key(tag, types[j]), key_tats) end
  for class, turn in pairs(f.turn) do redis.call('HSET', tag .. ':kvt', class .. ':' .. types[j], turn) end
end
out[#out + 1] = table.concat(unfilled)
out[#out + 1] = wake_at < 0 and -1 or math.ceil(wake_at)
local held_back = {}
for pair in pairs(held) do
  local bar = string.find(pair, '|', 1, true)
  held_back[#held_back + 1] = string.sub(pair, 1, bar - 1)
  held_back[#held_back + 1] = string.sub(pair, bar + 1)
end
out[#out + 1] = held_back
return out
