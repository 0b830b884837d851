-- acquire.lua: take a mutex if it is free (or expired), in one round trip.
-- KEYS[1]  the lock hash
-- ARGV[1]  owner token (128-bit random, base64url)
-- ARGV[2]  lease TTL in milliseconds
-- ARGV[3]  idle period in milliseconds: how long the fence outlives the last holder
-- Returns {1, fence}            acquired (or re-acquired by the same token after a lost reply)
--         {0, remaining_ms}     held by another owner for remaining_ms more
-- Errors  DLOCK_FOREIGN <type>  the key exists but is not a dlock mutex
local key, token = KEYS[1], ARGV[1]
local ttl, idle = tonumber(ARGV[2]), tonumber(ARGV[3])
local h = redis.call('HMGET', key, 'k', 'o', 'e', 'f')
if h[1] ~= 'mutex' then
  if h[1] then return redis.error_reply('DLOCK_FOREIGN dlock ' .. h[1]) end
  if redis.call('EXISTS', key) == 1 then return redis.error_reply('DLOCK_FOREIGN hash') end
end
-- Server time in microseconds: every deadline is the server's, never a client's.
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
if h[2] then
  local left = tonumber(h[3]) - now
  if left > 0 then
    if h[2] ~= token then return {0, math.ceil(left / 1000)} end
    -- Same token: a retry of an acquire whose reply was lost. Idempotent.
    redis.call('HSET', key, 'e', string.format('%.0f', now + ttl * 1000))
    redis.call('PEXPIRE', key, ttl + idle)
    return {1, tonumber(h[4])}
  end
end
-- Fences never go backwards: one more than the last, and never below the
-- server clock in microseconds, so a counter reclaimed after the idle period
-- (or lost in a restart) is reseeded above every fence it ever handed out.
local f = math.max((tonumber(h[4]) or 0) + 1, now)
redis.call('HSET', key, 'k', 'mutex', 'o', token, 'e', string.format('%.0f', now + ttl * 1000),
  'f', string.format('%.0f', f))
redis.call('PEXPIRE', key, ttl + idle)
return {1, f}
