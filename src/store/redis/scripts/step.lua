-- Records a step on the claim under ARGV[1] (the fence, as a completion's)
-- if its record holds exactly ARGV[2] steps, so that a write sent again
-- after it landed never records the step twice. The record keeps its TTL.
-- ARGV: owner, index, name, output
local index = argument(2, 'index')
local found = record()
if found and found.status == 'IN_PROGRESS' and found.owner == ARGV[1] then
  local count = tonumber(redis.call('HGET', KEYS[1], 'steps') or '0')
  if count == index then
    redis.call('HSET', KEYS[1], 'steps', index + 1, 'step:' .. index .. ':name', ARGV[3],
      'step:' .. index .. ':output', ARGV[4])
    return {1, {}}
  end
end
return {0, redis.call('HGETALL', KEYS[1])}
