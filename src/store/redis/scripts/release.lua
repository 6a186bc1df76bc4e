-- Deletes the claim under ARGV[1] (the fence).
-- ARGV: owner
local r = redis.call('HMGET', KEYS[1], 'status', 'owner')
if r[1] == 'IN_PROGRESS' and r[2] == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return {1, {}}
end
return {0, redis.call('HGETALL', KEYS[1])}
