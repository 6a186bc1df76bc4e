-- Extends the lease of the claim under ARGV[1] (the fence).
-- ARGV: owner, lease_until_ms, expiration_s, now_ms
argument(2, 'lease_until_ms')
local ttl = ttl_ms(argument(3, 'expiration_s'), argument(4, 'now_ms'))
local found = record()
if found and found.status == 'IN_PROGRESS' and found.owner == ARGV[1] then
  redis.call('HSET', KEYS[1], 'lease_until_ms', ARGV[2], 'expiration_s', ARGV[3])
  redis.call('PEXPIRE', KEYS[1], ttl)
  return {1, {}}
end
return {0, redis.call('HGETALL', KEYS[1])}
