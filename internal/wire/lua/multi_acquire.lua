-- multi_acquire.lua: take several mutexes of one Cluster slot at once, all or
-- none, with one owner token (a MultiLock's group, see multilock.go). Each
-- lock taken gets its own fence, exactly as acquire.lua grants one.
-- KEYS     for each lock i (1..n): KEYS[3i-2] its hash, KEYS[3i-1] its line,
--          KEYS[3i] its waiters (as for acquire.lua); all in one slot
-- ARGV[1]  owner token
-- ARGV[2]  lease TTL in milliseconds
-- Returns  {1, fence_1, ..., fence_n}  every lock is now the token's, for
--                                      ARGV[2] ms (a lock the token already
--                                      held, after a reply that was lost,
--                                      keeps its fence)
--          {0, i}                      nothing changed: lock i is held by
--                                      another owner, or a live waiter of
--                                      another token is in its line (a free
--                                      lock with a line is the line's: never
--                                      jumped)
--          {-1, i, what}               nothing changed: lock i's key is not
--                                      a dlock mutex; what it is ("dlock
--                                      KIND", "hash", or "type": not a hash)
-- Every lock is read before any is written, so a refusal changes nothing.
local token, ttl = ARGV[1], ARGV[2]
local n = #KEYS / 3
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local hs = {}
for i = 1, n do
  local key, line, waiters = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local h = redis.pcall('HMGET', key, 'o', 'f', 'k')
  if h.err then return {-1, i, 'type'} end
  if h[3] then return {-1, i, 'dlock ' .. h[3]} end
  if not h[2] and redis.call('EXISTS', key) == 1 then return {-1, i, 'hash'} end
  if h[1] and h[1] ~= token then return {0, i} end
  if not h[1] then
    local len = redis.call('LLEN', line)
    for j = 0, len - 1 do
      local w = redis.call('LINDEX', line, j)
      if w ~= token then
        local v = redis.call('HGET', waiters, w)
        if v and tonumber(string.match(v, '^(%d+)')) > now then return {0, i} end
      end
    end
  end
  hs[i] = h
end
local us = t[1] * 1000000 + t[2]
local out = {1}
for i = 1, n do
  local key, line, waiters, h = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i], hs[i]
  local f = tonumber(h[2])
  if h[1] ~= token then
    -- Our own place in its line, if a wait of ours left one, goes.
    if redis.call('HDEL', waiters, token) == 1 then
      redis.call('LREM', line, 1, token)
      if redis.call('LLEN', line) > 0 then redis.call('HSET', key, 'w', '1') end
    end
    -- Fences as acquire.lua grants them: never backwards, never below the
    -- server clock in microseconds.
    f = math.max((f or 0) + 1, us)
    redis.call('HSET', key, 'o', token, 'f', string.format('%.0f', f))
  end
  redis.call('PEXPIRE', key, ttl)
  out[i + 1] = f
end
return out
