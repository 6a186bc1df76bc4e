-- Extends the lease of the claim under ARGV[1] (the fence).
-- ARGV: owner, lease_until_ms, expiration_s
local r = redis.call('HMGET', KEYS[1], 'status', 'owner')
if r[1] == 'IN_PROGRESS' and r[2] == ARGV[1] then
  redis.call('HSET', KEYS[1], 'lease_until_ms', ARGV[2], 'expiration_s', ARGV[3])
  redis.call('PEXPIREAT', KEYS[1], (tonumber(ARGV[3]) + 1) * 1000)
  return {1, {}}
end
return {0, redis.call('HGETALL', KEYS[1])}
