-- Deletes the record, unless ARGV[1] is '1' and it is IN_PROGRESS. Never
-- deletes a key that holds something else than a record.
-- ARGV: unless_in_progress
local found = record()
if found and not (ARGV[1] == '1' and found.status == 'IN_PROGRESS') then
  redis.call('DEL', KEYS[1])
  return {1, {}}
end
return {0, redis.call('HGETALL', KEYS[1])}
