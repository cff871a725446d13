-- Job record helpers shared by every script (see dispatcher/queue/records.py for the fields).
-- Active states keep '<type>|<class>|<state>' totals in the shard's counts hash.
--- @include "codes"
local function load_job(jobs, id)
  local raw = redis.call('HGET', jobs, id)
  if not raw then return nil end
  return cmsgpack.unpack(raw)
end

local function save_job(jobs, id, rec)
  redis.call('HSET', jobs, id, cmsgpack.pack(rec))
end

-- n jobs of one type and class entering (n > 0) or leaving (n < 0) a state (counted if active).
local function add_counts(counts, job_type, class, state, n)
  if n ~= 0 and ACTIVE[state] then
    local field = job_type .. '|' .. class .. '|' .. state
    if redis.call('HINCRBY', counts, field, n) <= 0 then
      redis.call('HDEL', counts, field)
    end
  end
end

local function count(counts, rec, state, delta)
  add_counts(counts, rec.t, rec.p, state, delta)
end

-- set_state (one record) and set_states (a batch) are the only places a record's state changes,
-- so the counts stay in step. A new record arrives with its state: enqueue counts its batch, and
-- restore_jobs clears the state it was packed with before setting it.
local function set_state(counts, rec, state)
  if rec.s then count(counts, rec, rec.s, -1) end
  count(counts, rec, state, 1)
  rec.s = state
end

-- Records all in state `from` move to `to`, counted once per type and class rather than per job
-- (the batches of lease and ack); the caller saves them.
local function set_states(counts, recs, from, to)
  local moved = {}  -- type -> class -> n
  for _, rec in ipairs(recs) do
    rec.s = to
    local classes = moved[rec.t]
    if not classes then
      classes = {}
      moved[rec.t] = classes
    end
    classes[rec.p] = (classes[rec.p] or 0) + 1
  end
  for job_type, classes in pairs(moved) do
    for class, n in pairs(classes) do
      add_counts(counts, job_type, class, from, -n)
      add_counts(counts, job_type, class, to, n)
    end
  end
end

local function owns(meta, epoch)
  return redis.call('HGET', meta, 'epoch') == epoch
end

local function holds(rec, token)
  return rec ~= nil and rec.s == STATE.LEASED and rec.k == token
end

-- Commands take at most this many arguments at a time (Lua's unpack has a stack limit).
local BATCH_ARGS = 4000
local function batched(command, key, args)
  for j = 1, #args, BATCH_ARGS do
    redis.call(command, key, unpack(args, j, math.min(j + BATCH_ARGS - 1, #args)))
  end
end

-- The values of many fields of a hash (false where missing), one HMGET per chunk: a call per
-- field costs more than the work of a small job. `command` reads another kind of key the same way
-- (ZMSCORE: the scores of members of a sorted set).
local function read_many(key, fields, command)
  local values = {}
  for j = 1, #fields, BATCH_ARGS do
    local last = math.min(j + BATCH_ARGS - 1, #fields)
    local found = redis.call(command or 'HMGET', key, unpack(fields, j, last))
    for n = 1, last - j + 1 do values[j + n - 1] = found[n] end
  end
  return values
end
