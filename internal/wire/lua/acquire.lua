-- acquire.lua: take a mutex if it is free, in one round trip; a waiter that
-- finds it held may take (or keep alive) a place in its line, so that the
-- release hands the lock straight to it (see release.lua).
-- KEYS[1]  the lock hash: o = owner token, f = last fence, w = someone may be
--          in line (see release.lua); its PEXPIRE is the lease
-- KEYS[2]  the line, KEYS[3] the waiters, as for fair_acquire.lua; optional:
--          without KEYS[3] no place is taken, and KEYS[2] is not read
--          (quorum_acquire.lua, which runs this script after its own check,
--          passes its epoch key there)
-- ARGV[1]  owner token (128-bit random, base64url)
-- ARGV[2]  lease TTL in milliseconds
-- ARGV[3]  with the line: liveness in milliseconds (a place not refreshed for
--          this long is skipped); without it, not read
-- ARGV[4]  with the line: the waiter's hand-over channel (PREFIX{NAME}:c:CLIENT);
--          without it, optional: a proposed fence (0: none), for the masters
--          of a quorum grant (quorum_acquire.lua): the fence is at least
--          this, as far as a tenth of the TTL ahead of the clock allows
-- Returns {1, fence}            acquired
--         {1, fence, 1}         the token already held it: re-acquired after a
--                               lost reply, or handed over while in line
--         {0, remaining_ms, f}  held by another owner (granted fence f) for remaining_ms more
-- Errors  DLOCK_FOREIGN <what>  the key exists but is not a dlock mutex
local key, token, ttl = KEYS[1], ARGV[1], ARGV[2]
local h = redis.call('HMGET', key, 'o', 'f', 'k')
if h[3] then return redis.error_reply('DLOCK_FOREIGN dlock ' .. h[3]) end
if not h[2] and redis.call('EXISTS', key) == 1 then
  return redis.error_reply('DLOCK_FOREIGN hash')
end
if h[1] then
  if h[1] ~= token then
    if KEYS[3] then
      local line, waiters, live = KEYS[2], KEYS[3], tonumber(ARGV[3])
      local t = redis.call('TIME')
      local now = t[1] * 1000 + math.floor(t[2] / 1000)
      if redis.call('HSET', waiters, token, string.format('%.0f,%s,%s', now + live, ttl, ARGV[4])) == 1 then
        redis.call('RPUSH', line, token)
      end
      redis.call('PEXPIRE', line, 2 * live)
      redis.call('PEXPIRE', waiters, 2 * live)
      redis.call('HSET', key, 'w', '1') -- the release must look at the line
    end
    return {0, redis.call('PTTL', key), tonumber(h[2])}
  end
  -- Same token: a retry of an acquire whose reply was lost, or handed over
  -- while in line. Idempotent.
  redis.call('PEXPIRE', key, ttl)
  return {1, tonumber(h[2]), 1}
end
-- Free: taken at once, even if others are in line (default mode is not FIFO
-- between clients; Fair() callers use fair_acquire.lua).
if KEYS[3] and redis.call('HDEL', KEYS[3], token) == 1 then
  redis.call('LREM', KEYS[2], 1, token)
  if redis.call('LLEN', KEYS[2]) > 0 then redis.call('HSET', key, 'w', '1') end
end
-- Fences never go backwards: one more than the last, and never below the
-- server clock in microseconds, so a counter that expired with its lock,
-- was reclaimed after the idle period, was lost in a restart, or came back
-- older than it was (a lost AOF tail) still goes past every fence it handed
-- out (grants are microseconds apart). TestFault8AOFTailLost fails without
-- the clock term. A proposed fence only makes it larger: the masters of a
-- quorum grant then hand out one fence and none needs raising (quorum.go,
-- propose); bounded, so that one master's fast clock, once proposed, does
-- not carry every later fence ahead.
local t = redis.call('TIME')
local us = t[1] * 1000000 + t[2]
local f = math.max((tonumber(h[2]) or 0) + 1, us)
if not KEYS[3] and ARGV[4] then
  f = math.max(f, math.min(tonumber(ARGV[4]), us + tonumber(ttl) * 100))
end
redis.call('HSET', key, 'o', token, 'f', string.format('%.0f', f))
redis.call('PEXPIRE', key, ttl)
return {1, f}
