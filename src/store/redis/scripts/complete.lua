-- Completes the claim under ARGV[1] (the fence) with its response.
-- ARGV: owner, response, expiration_s, now_ms
local ttl = ttl_ms(argument(3, 'expiration_s'), argument(4, 'now_ms'))
local found = record()
if found and found.status == 'IN_PROGRESS' and found.owner == ARGV[1] then
  redis.call('HSET', KEYS[1], 'status', 'COMPLETED', 'response', ARGV[2],
    'expiration_s', ARGV[3], 'completed_at_ms', ARGV[4])
  -- A completed record replays its response: its steps go.
  local steps = tonumber(redis.call('HGET', KEYS[1], 'steps') or '0')
  for i = 0, steps - 1 do
    redis.call('HDEL', KEYS[1], 'step:' .. i .. ':name', 'step:' .. i .. ':output')
  end
  redis.call('HDEL', KEYS[1], 'lease_until_ms', 'steps')
  redis.call('PEXPIRE', KEYS[1], ttl)
  return {1, {}}
end
return {0, redis.call('HGETALL', KEYS[1])}
