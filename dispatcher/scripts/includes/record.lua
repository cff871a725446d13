-- Job record helpers shared by every script (see dispatcher/records.py for the fields).
-- Counted states keep '<type>|<class>|<state>' totals in the shard's counts hash.
local function load_job(jobs, id)
  local raw = redis.call('HGET', jobs, id)
  if not raw then return nil end
  return cmsgpack.unpack(raw)
end

local function save_job(jobs, id, rec)
  redis.call('HSET', jobs, id, cmsgpack.pack(rec))
end

local COUNTED = {delayed = true, ready = true, leased = true}

local function count(counts, rec, state, delta)
  if COUNTED[state] then
    local field = rec.t .. '|' .. rec.p .. '|' .. state
    if redis.call('HINCRBY', counts, field, delta) <= 0 then
      redis.call('HDEL', counts, field)
    end
  end
end

-- The one place a record changes state: keeps the counts in step.
local function set_state(counts, rec, state)
  if rec.s then count(counts, rec, rec.s, -1) end
  count(counts, rec, state, 1)
  rec.s = state
end

local function owns(meta, epoch)
  return redis.call('HGET', meta, 'epoch') == epoch
end

local function holds(rec, token)
  return rec ~= nil and rec.s == 'leased' and rec.k == token
end
