--[[ Make a shard's settings hash equal to the settings a process read from the DB, unless another
process changed a type's settings since this one began its read: that one raised the generation
before reading the change back, and it (or the owner's next pass) writes the newer settings. Without
the check, an owner's pass that read the DB just before a change would put the old settings back
over the new ones until its next pass: a pause undone for a second.
Input:  KEYS[1] flow, KEYS[2] flow generation;
        ARGV[1] the generation read before the DB was read ('' when there was none),
        then type, packed settings pairs: every type of the shard with settings
Output: -1 when the generation moved (nothing written), else the number of fields written or deleted
]]
--- @include "record"
if (redis.call('GET', KEYS[2]) or '') ~= ARGV[1] then
  return -1
end
local want = {}
for i = 2, #ARGV, 2 do
  want[ARGV[i]] = ARGV[i + 1]
end
local have = redis.call('HGETALL', KEYS[1])
local gone = {}
for i = 1, #have, 2 do
  local wanted = want[have[i]]
  if wanted == nil then
    gone[#gone + 1] = have[i]
  elseif wanted == have[i + 1] then
    want[have[i]] = nil
  end
end
local stale = {}
for job_type, packed in pairs(want) do
  stale[#stale + 1] = job_type
  stale[#stale + 1] = packed
end
batched('HSET', KEYS[1], stale)
batched('HDEL', KEYS[1], gone)
return #stale / 2 + #gone
