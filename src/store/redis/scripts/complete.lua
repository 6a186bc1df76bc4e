-- Completes the claim under ARGV[1] (the fence) with its response.
-- ARGV: owner, response, expiration_s, now_ms
local ttl = ttl_ms(argument(3, 'expiration_s'), argument(4, 'now_ms'))
local found = record()
if found and found.status == 'IN_PROGRESS' and found.owner == ARGV[1] then
  redis.call('HSET', KEYS[1], 'status', 'COMPLETED', 'response', ARGV[2],
    'expiration_s', ARGV[3], 'completed_at_ms', ARGV[4])
  -- A completed record replays its response: its steps go. By the
  -- hash's own fields, not its `steps` count: a count that is not a
  -- number made this script fail halfway (the HSET above kept, the rest
  -- not), one below the fields left them on the completed record, and one
  -- far above them looped that many HDELs inside the script.
  for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
    if string.sub(field, 1, 5) == 'step:' then
      redis.call('HDEL', KEYS[1], field)
    end
  end
  redis.call('HDEL', KEYS[1], 'lease_until_ms', 'steps')
  redis.call('PEXPIRE', KEYS[1], ttl)
  return {1, {}}
end
return {0, redis.call('HGETALL', KEYS[1])}
