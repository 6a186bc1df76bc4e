-- Replaces a lapsed claim: IN_PROGRESS under ARGV[1], its lease passed.
-- ARGV: lapsed, now_ms, owner, fingerprint, expiration_s, lease_until_ms, attempt, first_started_ms
local r = redis.call('HMGET', KEYS[1], 'status', 'owner', 'lease_until_ms')
if r[1] == 'IN_PROGRESS' and r[2] == ARGV[1] and r[3] and tonumber(r[3]) < tonumber(ARGV[2]) then
  redis.call('HSET', KEYS[1], 'owner', ARGV[3], 'fingerprint', ARGV[4], 'expiration_s', ARGV[5],
    'lease_until_ms', ARGV[6], 'created_at_ms', ARGV[2], 'attempt', ARGV[7],
    'first_started_ms', ARGV[8])
  redis.call('PEXPIREAT', KEYS[1], (tonumber(ARGV[5]) + 1) * 1000)
  return {1, {}}
end
return {0, redis.call('HGETALL', KEYS[1])}
