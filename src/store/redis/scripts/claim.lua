-- Claims KEYS[1] unless a record is there that has not expired.
-- ARGV: now_s, id, owner, fingerprint, expiration_s, lease_until_ms, now_ms, attempt, first_started_ms
local now_s = argument(1, 'now_s')
local expiration_s = argument(5, 'expiration_s')
argument(6, 'lease_until_ms')
local ttl = ttl_ms(expiration_s, argument(7, 'now_ms'))
argument(8, 'attempt')
argument(9, 'first_started_ms')
-- HLEN is 0 for an absent key: a new key costs no second read.
if redis.call('HLEN', KEYS[1]) > 0 then
  if record().expiration_s >= now_s then
    return {0, redis.call('HGETALL', KEYS[1])}
  end
  -- An expired record: its fields must not outlive it in the new one.
  redis.call('DEL', KEYS[1])
end
redis.call('HSET', KEYS[1], 'id', ARGV[2], 'status', 'IN_PROGRESS', 'owner', ARGV[3],
  'fingerprint', ARGV[4], 'expiration_s', ARGV[5], 'lease_until_ms', ARGV[6],
  'created_at_ms', ARGV[7], 'attempt', ARGV[8], 'first_started_ms', ARGV[9])
redis.call('PEXPIRE', KEYS[1], ttl)
return {1, {}}
