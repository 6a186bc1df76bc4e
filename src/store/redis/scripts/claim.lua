-- Claims KEYS[1] unless a record is there that has not expired.
-- ARGV: now_s, id, owner, fingerprint, expiration_s, lease_until_ms, now_ms, attempt, first_started_ms
-- HLEN is 0 for an absent key: a new key costs no second read.
if redis.call('HLEN', KEYS[1]) > 0 then
  local expiration = redis.call('HGET', KEYS[1], 'expiration_s')
  if not expiration then
    -- A hash without an expiration is not a record: someone else's data,
    -- neither overwritten nor claimed.
    return redis.error_reply('NOTRECORD the key holds a hash that is not an idempotency record')
  end
  if tonumber(expiration) >= tonumber(ARGV[1]) then
    return {0, redis.call('HGETALL', KEYS[1])}
  end
  -- An expired record: its fields must not outlive it in the new one.
  redis.call('DEL', KEYS[1])
end
redis.call('HSET', KEYS[1], 'id', ARGV[2], 'status', 'IN_PROGRESS', 'owner', ARGV[3],
  'fingerprint', ARGV[4], 'expiration_s', ARGV[5], 'lease_until_ms', ARGV[6],
  'created_at_ms', ARGV[7], 'attempt', ARGV[8], 'first_started_ms', ARGV[9])
redis.call('PEXPIREAT', KEYS[1], (tonumber(ARGV[5]) + 1) * 1000)
return {1, {}}
