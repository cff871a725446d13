--[[ Note committed jobs whose push failed (Redis refused it, no process owned the shard, the owner
was out of reach), so that the reconciler that restores them knows Redis never had them: that is
expected, where a job Redis had and lost is not. Any process may note; no epoch is checked.
Input:  KEYS[1] unpushed; ARGV[1] now (ms), then the ids
Output: the number of ids noted
Notes older than an hour go; the reconciler drops a note when it restores the job.
]]
--- @include "record"
local now = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - 3600000)
local args = {}
for i = 2, #ARGV do
  args[#args + 1] = now
  args[#args + 1] = ARGV[i]
end
batched('ZADD', KEYS[1], args)
return #ARGV - 1
