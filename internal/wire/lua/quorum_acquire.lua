-- quorum_acquire.lua: one master's vote in quorum mode (see quorum.go). It
-- takes a mutex as acquire.lua does without a line, but only on a master
-- that has been up, with its data, for the restart delay: a master that
-- restarted without its data must not vote while a lease it granted before
-- may still be believed valid.
-- KEYS[1]  the lock hash (o = owner token, f = last fence), as acquire.lua
-- KEYS[2]  the master's epoch key: when (server ms) its data began; set by
--          the client from INFO (uptime) when missing, lost with the data
-- ARGV[1]  owner token
-- ARGV[2]  lease TTL in milliseconds
-- ARGV[3]  restart delay in milliseconds
-- Returns {1, fence}            acquired
--         {1, fence, 1}         the token already held it (a retry)
--         {0, remaining_ms, f, owner}  held by another owner (fence f): the
--                               client tells a majority's holder from
--                               contenders that split the masters
--         {2, wait_ms}          not voting for wait_ms more (restarted);
--                               wait_ms -1: no epoch key (never certified,
--                               or its data was lost)
-- Errors  DLOCK_FOREIGN <what>  the key exists but is not a dlock mutex
local key, token, ttl = KEYS[1], ARGV[1], ARGV[2]
local t = redis.call('TIME')
local e = tonumber(redis.call('GET', KEYS[2]))
if not e then return {2, -1} end
local since = t[1] * 1000 + math.floor(t[2] / 1000) - e
if since < tonumber(ARGV[3]) then return {2, tonumber(ARGV[3]) - since} end
local h = redis.call('HMGET', key, 'o', 'f', 'k')
if h[3] then return redis.error_reply('DLOCK_FOREIGN dlock ' .. h[3]) end
if not h[2] and redis.call('EXISTS', key) == 1 then
  return redis.error_reply('DLOCK_FOREIGN hash')
end
if h[1] then
  if h[1] ~= token then return {0, redis.call('PTTL', key), tonumber(h[2]), h[1]} end
  redis.call('PEXPIRE', key, ttl)
  return {1, tonumber(h[2]), 1}
end
-- As acquire.lua: one more than the last, never below the clock in µs.
local f = math.max((tonumber(h[2]) or 0) + 1, t[1] * 1000000 + t[2])
redis.call('HSET', key, 'o', token, 'f', string.format('%.0f', f))
redis.call('PEXPIRE', key, ttl)
return {1, f}
