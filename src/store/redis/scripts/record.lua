-- Prepended to every script of the store: the checks each runs before its
-- first write, so that nothing is ever left half-written or without a TTL.

-- A non-negative integer that a Lua number (a double) holds exactly, as
-- the store writes them; nil for anything else.
local function exact(text)
  if type(text) ~= 'string' or #text > 16 or not string.match(text, '^%d+$') then
    return nil
  end
  local n = tonumber(text)
  if n > 9007199254740991 then
    return nil
  end
  return n
end

-- ARGV[i] as a number; stops the script, nothing written, otherwise.
local function argument(i, name)
  local n = exact(ARGV[i])
  if not n then
    error({err = 'REJECTED argument ' .. name .. ' is not an integer below 2^53'})
  end
  return n
end

-- How long the record is kept, in milliseconds, relative to the engine's
-- now: Redis counts it on its own clock, so an offset between the two
-- clocks moves nothing (an absolute PEXPIREAT would expire the record at
-- once, or never).
local function ttl_ms(expiration_s, now_ms)
  local expire_at_ms = (expiration_s + 1) * 1000
  if expire_at_ms > 9007199254740991 then
    error({err = 'REJECTED expiration_s is beyond what the store expires exactly'})
  end
  return math.max(1, expire_at_ms - now_ms)
end

local function not_a_record(why)
  error({err = 'NOTRECORD the key holds a hash that is not an idempotency record: ' .. why})
end

-- The record under KEYS[1], or nil when there is none. A hash whose fields
-- are not a record's (someone else's data) stops the script, untouched.
local function record()
  local r = redis.call('HMGET', KEYS[1], 'status', 'owner', 'expiration_s', 'lease_until_ms')
  if not r[1] then
    if redis.call('EXISTS', KEYS[1]) == 0 then
      return nil
    end
    not_a_record('it has no status')
  end
  if r[1] ~= 'IN_PROGRESS' and r[1] ~= 'COMPLETED' then
    not_a_record('its status is not IN_PROGRESS or COMPLETED')
  end
  if not r[2] then
    not_a_record('it has no owner')
  end
  local expiration_s = exact(r[3])
  if not expiration_s then
    not_a_record('its expiration_s is not a number')
  end
  local lease_until_ms = nil
  if r[4] then
    lease_until_ms = exact(r[4])
    if not lease_until_ms then
      not_a_record('its lease_until_ms is not a number')
    end
  end
  return {status = r[1], owner = r[2], expiration_s = expiration_s, lease_until_ms = lease_until_ms}
end

