-- Deletes the claim under ARGV[1] (the fence).
-- ARGV: owner
local found = record()
if found and found.status == 'IN_PROGRESS' and found.owner == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return {1, {}}
end
return {0, redis.call('HGETALL', KEYS[1])}
