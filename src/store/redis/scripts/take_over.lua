-- Replaces a lapsed claim: IN_PROGRESS under ARGV[1], its lease passed.
-- ARGV: lapsed, now_ms, owner, fingerprint, expiration_s, lease_until_ms, attempt, first_started_ms
local now_ms = argument(2, 'now_ms')
local ttl = ttl_ms(argument(5, 'expiration_s'), now_ms)
argument(6, 'lease_until_ms')
argument(7, 'attempt')
argument(8, 'first_started_ms')
local found = record()
if found and found.status == 'IN_PROGRESS' and found.owner == ARGV[1]
    and found.lease_until_ms and found.lease_until_ms < now_ms then
  redis.call('HSET', KEYS[1], 'owner', ARGV[3], 'fingerprint', ARGV[4], 'expiration_s', ARGV[5],
    'lease_until_ms', ARGV[6], 'created_at_ms', ARGV[2], 'attempt', ARGV[7],
    'first_started_ms', ARGV[8])
  redis.call('PEXPIRE', KEYS[1], ttl)
  return {1, {}}
end
return {0, redis.call('HGETALL', KEYS[1])}
