-- acquire.lua: take a mutex if it is free, in one round trip.
-- KEYS[1]  the lock hash: o = owner token, f = last fence; its PEXPIRE is the lease
-- ARGV[1]  owner token (128-bit random, base64url)
-- ARGV[2]  lease TTL in milliseconds
-- Returns {1, fence}            acquired (or re-acquired by the same token after a lost reply)
--         {0, remaining_ms, f}  held by another owner (granted fence f) for remaining_ms more
-- Errors  DLOCK_FOREIGN <what>  the key exists but is not a dlock mutex
local key, token, ttl = KEYS[1], ARGV[1], ARGV[2]
local h = redis.call('HMGET', key, 'o', 'f', 'k')
if h[3] then return redis.error_reply('DLOCK_FOREIGN dlock ' .. h[3]) end
if not h[2] and redis.call('EXISTS', key) == 1 then
  return redis.error_reply('DLOCK_FOREIGN hash')
end
if h[1] then
  if h[1] ~= token then return {0, redis.call('PTTL', key), tonumber(h[2])} end
  -- Same token: a retry of an acquire whose reply was lost. Idempotent.
  redis.call('PEXPIRE', key, ttl)
  return {1, tonumber(h[2])}
end
-- Fences never go backwards: one more than the last, and never below the
-- server clock in microseconds, so a counter that expired with its lock,
-- was reclaimed after the idle period, was lost in a restart, or came back
-- older than it was (a lost AOF tail) still goes past every fence it handed
-- out (grants are microseconds apart). TestFault8AOFTailLost fails without
-- the clock term.
local t = redis.call('TIME')
local f = math.max((tonumber(h[2]) or 0) + 1, t[1] * 1000000 + t[2])
redis.call('HSET', key, 'o', token, 'f', string.format('%.0f', f))
redis.call('PEXPIRE', key, ttl)
return {1, f}
