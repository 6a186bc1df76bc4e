-- Deletes the record, unless ARGV[1] is '1' and it is IN_PROGRESS.
-- ARGV: unless_in_progress
local status = redis.call('HGET', KEYS[1], 'status')
if status and not (ARGV[1] == '1' and status == 'IN_PROGRESS') then
  redis.call('DEL', KEYS[1])
  return {1, {}}
end
return {0, redis.call('HGETALL', KEYS[1])}
