-- Flow control's per-key structures (keys.py documents each; flow.py the settings they obey).
-- Jobs with a concurrency key wait in their key's ready set, not the type's; the keys with ready jobs
-- that may lease now take turns in the type's round robin: a sorted set scored by turn number, a
-- counter per type and class, so the key with the lowest goes next and then to the back. The
-- scripts build these names from the shard's tag: a lease meets keys it could not name in advance.
-- Every name carries the shard's hash tag, so it lives in the slot of the keys the script was given.
local function flow_tag(key, suffix)
  return string.sub(key, 1, #key - #suffix)
end

local function kq_key(tag, class, job_type)
  return tag .. ':kq:' .. class .. ':' .. job_type
end

local function kw_key(tag, class, job_type)
  return tag .. ':kw:' .. class .. ':' .. job_type
end

local function kblocked_key(tag, job_type)
  return tag .. ':kblocked:' .. job_type
end

local function kr_key(tag, class, job_type, key)
  return tag .. ':kr:' .. class .. ':' .. #job_type .. ':' .. job_type .. ':' .. key
end

local function krun_key(tag, job_type)
  return tag .. ':krun:' .. job_type
end

local function kgate_key(tag, job_type)
  return tag .. ':kgate:' .. job_type
end

local function khold_key(tag, job_type)
  return tag .. ':khold:' .. job_type
end

-- The values of the shard's `keyed` hash: the type has had keyed jobs; and some of its keys have had
-- a RateLimited hold (their gates are read even without a per-key rate).
local KEYED = {KEYS = '1', KEY_GATES = '2'}

local function kturn_key(tag, class, job_type)
  return tag .. ':kturn:' .. class .. ':' .. job_type
end

-- The next turn number of a type and class's round: a key joining with it goes to the back.
local function next_turn(tag, class, job_type)
  return redis.call('HINCRBY', tag .. ':kvt', class .. ':' .. job_type, 1)
end

local function join_round(tag, class, job_type, key)
  local round = kq_key(tag, class, job_type)
  if not redis.call('ZSCORE', round, key) then
    redis.call('ZADD', round, next_turn(tag, class, job_type), key)
  end
end

-- GCRA's emission interval and burst tolerance (ms) of a rate per second with a burst: a lease may go
-- when the theoretical arrival time minus the tolerance is not in the future. No rate: (0, 0), and the
-- gate only holds what a RateLimited hold set.
local function gcra(rate, burst)
  local interval, tolerance = 0, 0
  if rate then
    interval = 1000 / rate
    tolerance = (burst - 1) * interval
  end
  return interval, tolerance
end

-- A stored theoretical arrival time as the current rate sees it: one set under a slower rate (or a
-- typo) is capped at an empty bucket of this rate, open now, so a change of rate holds at once.
local function gate_time(tat, interval, tolerance, now)
  return math.min(tat, now + tolerance)
end

-- Keyed jobs becoming ready, all of one type, class and key: into the key's ready set (scores as the
-- ready sets'), the key at the back of the round robin unless it is in it already.
local function flow_add_ready(tag, job_type, class, key, scored)
  batched('ZADD', kr_key(tag, class, job_type, key), scored)
  join_round(tag, class, job_type, key)
  redis.call('HSETNX', tag .. ':keyed', job_type, KEYED.KEYS)
end

-- Leases of these records ended (ack, nack, expiry, return): their keys' slots are free again, and a
-- key that waited at its limit with ready jobs rejoins the round robin.
local function flow_release(tag, recs)
  local freed = {}  -- type -> key -> n
  for _, rec in ipairs(recs) do
    if rec.g then
      local keys = freed[rec.t]
      if not keys then
        keys = {}
        freed[rec.t] = keys
      end
      keys[rec.g] = (keys[rec.g] or 0) + 1
    end
  end
  for job_type, keys in pairs(freed) do
    local running, blocked = krun_key(tag, job_type), kblocked_key(tag, job_type)
    for key, n in pairs(keys) do
      if redis.call('HINCRBY', running, key, -n) <= 0 then redis.call('HDEL', running, key) end
      -- A key with ready jobs is in the round, waiting for its rate, or blocked: only a blocked one
      -- rejoins (in each class it was blocked in).
      local classes = tonumber(redis.call('HGET', blocked, key) or 0)
      if classes > 0 then
        redis.call('HDEL', blocked, key)
        for class = 0, 2 do
          if bit.band(classes, 2 ^ class) ~= 0 then join_round(tag, class, job_type, key) end
        end
      end
    end
  end
end

-- A handler's RateLimited hold: the record's key (its type without one) leases nothing before `until`
-- (steady ms), whatever its rate limit would allow. Holds are kept apart from the rates' gates, and
-- one past its time is dropped by the next lease of the type.
local function flow_hold(tag, rec, until_ms)
  local holds, member
  if rec.g then
    holds, member = khold_key(tag, rec.t), rec.g
    redis.call('HSET', tag .. ':keyed', rec.t, KEYED.KEY_GATES)
  else
    holds, member = tag .. ':hold', rec.t
  end
  local current = tonumber(redis.call('ZSCORE', holds, member) or 0)
  if until_ms > current then redis.call('ZADD', holds, until_ms, member) end
end
