-- Completes the claim under ARGV[1] (the fence) with its response.
-- ARGV: owner, response, expiration_s, now_ms
local r = redis.call('HMGET', KEYS[1], 'status', 'owner')
if r[1] == 'IN_PROGRESS' and r[2] == ARGV[1] then
  redis.call('HSET', KEYS[1], 'status', 'COMPLETED', 'response', ARGV[2],
    'expiration_s', ARGV[3], 'completed_at_ms', ARGV[4])
  redis.call('HDEL', KEYS[1], 'lease_until_ms')
  redis.call('PEXPIREAT', KEYS[1], (tonumber(ARGV[3]) + 1) * 1000)
  return {1, {}}
end
return {0, redis.call('HGETALL', KEYS[1])}
