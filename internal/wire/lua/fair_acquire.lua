-- fair_acquire.lua: take a Fair() mutex if it is free and nobody alive is
-- ahead; otherwise take (or keep alive) a place in its FIFO line.
-- KEYS[1]  the lock hash (o, f, w as for acquire.lua; p = the fence that handed it over)
-- KEYS[2]  the line: a list of waiter tokens in arrival order
-- KEYS[3]  the waiters: hash token -> "deadline_ms,ttl_ms,channel" (deadline:
--          server time until which the waiter's place holds without another
--          call; channel: where to tell the waiter it was handed the lock)
-- ARGV[1]  owner token
-- ARGV[2]  lease TTL in milliseconds
-- ARGV[3]  liveness in milliseconds: a place not refreshed for this long is dropped
-- ARGV[4]  "1" to take a place in line when the lock is busy (Lock), else not (TryLock)
-- ARGV[5]  the waiter's hand-over channel (in the lock's slot: PREFIX{NAME}:c:CLIENT)
-- Returns {1, fence}             acquired
--         {1, fence, 1}          was handed the lock while waiting (or a retry)
--         {0, remaining_ms, f}   in line; the holder (fence f) has remaining_ms left
-- Errors  DLOCK_FOREIGN <what>   the key exists but is not a dlock mutex
local key, line, waiters = KEYS[1], KEYS[2], KEYS[3]
local token, ttl, live = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local h = redis.call('HMGET', key, 'o', 'f', 'k')
if h[3] then return redis.error_reply('DLOCK_FOREIGN dlock ' .. h[3]) end
if not h[2] and redis.call('EXISTS', key) == 1 then
  return redis.error_reply('DLOCK_FOREIGN hash')
end
if h[1] == token then
  -- Handed over while we waited (or a retry): ours.
  redis.call('PEXPIRE', key, ttl)
  return {1, tonumber(h[2]), 1}
end
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
-- Drop waiters at the head of the line that stopped keeping their place.
local head = redis.call('LINDEX', line, 0)
while head and head ~= token do
  local v = redis.call('HGET', waiters, head)
  if v and tonumber(string.match(v, '^(%d+)')) > now then break end
  redis.call('LPOP', line)
  redis.call('HDEL', waiters, head)
  head = redis.call('LINDEX', line, 0)
end
if not h[1] and (not head or head == token) then
  if head == token then redis.call('LPOP', line) end
  redis.call('HDEL', waiters, token)
  local f = math.max((tonumber(h[2]) or 0) + 1, t[1] * 1000000 + t[2])
  redis.call('HSET', key, 'o', token, 'f', string.format('%.0f', f))
  if redis.call('LLEN', line) > 0 then redis.call('HSET', key, 'w', '1') end
  redis.call('PEXPIRE', key, ttl)
  return {1, f}
end
if ARGV[4] ~= '1' then -- TryLock: do not take a place in line
  return {0, redis.call('PTTL', key), tonumber(h[2]) or 0}
end
if redis.call('HSET', waiters, token, string.format('%.0f,%d,%s', now + live, ttl, ARGV[5])) == 1 then
  redis.call('RPUSH', line, token)
end
redis.call('PEXPIRE', line, 2 * live)
redis.call('PEXPIRE', waiters, 2 * live)
-- The release must look at the line (a key without f is not made here: no
-- release can come before an acquire creates it).
if h[2] then redis.call('HSET', key, 'w', '1') end
local left = redis.call('PTTL', key)
if left < 0 then left = live end -- free, but a live waiter is ahead: look again soon
return {0, left, tonumber(h[2]) or 0}
