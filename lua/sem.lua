-- sem.lua: a weighted FIFO semaphore whose every holding is a lease; the
-- read-write lock is the same thing with readers taking 1 permit and writers
-- all of them. One script, several operations, so the rules live in one place.
-- KEYS[1]  the semaphore hash: k = kind, s = size, u = permits held, f = last fence
-- KEYS[2]  holders: sorted set token -> lease deadline (server ms)
-- KEYS[3]  holdings: hash token -> "permits,fence"
-- KEYS[4]  the line: list of waiter tokens in arrival order
-- KEYS[5]  the waiters: hash token -> "deadline_ms,ttl_ms,channel,permits"
-- ARGV[1]  the operation:
--   a token ttl live join channel n size kind idle   acquire (or keep a place in line)
--   r token idle                                     release
--   l token idle                                     leave the line, or release if granted
--   e token ttl idle                                 extend a holding
--   t token                                          remaining ms of a holding
-- Replies: a -> {1, fence} held; {0, wait_ms, fence} not (in line if join = "1")
--          r -> 1 released, 0 not a holder (lost)
--          l -> 1 was a holder and released, 0 left the line
--          e -> 1 extended, 0 not a holder;  t -> ms, or -1 if not a holder
-- Errors:  DLOCK_FOREIGN <what>   the key is not a dlock lock of this kind
--          DLOCK_SIZE <size>      the semaphore is in use with another size
local main, holders, holdings, line, waiters = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local op, token = ARGV[1], ARGV[2]
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local nowus = t[1] * 1000000 + t[2]
local st = redis.call('HMGET', main, 'k', 's', 'u', 'f')
local size, used, fence = tonumber(st[2]), tonumber(st[3]) or 0, tonumber(st[4]) or 0

local function fmt(x) return string.format('%.0f', x) end

-- Drop holdings whose lease ran out: their permits come back.
local function prune()
  local gone = redis.call('ZRANGEBYSCORE', holders, '-inf', now)
  for _, g in ipairs(gone) do
    local v = redis.call('HGET', holdings, g)
    if v then used = used - tonumber(string.match(v, '^(%d+)')) end
    redis.call('HDEL', holdings, g)
  end
  if #gone > 0 then redis.call('ZREMRANGEBYSCORE', holders, '-inf', now) end
end

-- Make tok a holder of n permits for ttl ms; returns its fence.
local function give(tok, n, ttl)
  fence = math.max(fence + 1, nowus)
  used = used + n
  redis.call('ZADD', holders, now + ttl, tok)
  redis.call('HSET', holdings, tok, fmt(n) .. ',' .. fmt(fence))
  return fence
end

-- Hand permits to the live waiters at the head of the line, in order, while
-- they fit; a head that does not fit blocks those behind it (FIFO). Dead
-- heads are dropped. Returns the fence if the caller (token) was granted.
local function serve()
  local mine
  while true do
    local w = redis.call('LINDEX', line, 0)
    if not w then break end
    local v = redis.call('HGET', waiters, w)
    local dl, wttl, wch, wn
    if v then dl, wttl, wch, wn = string.match(v, '^(%d+),(%d+),([^,]*),(%d+)$') end
    if dl and tonumber(dl) > now then
      wn = tonumber(wn)
      if used + wn > size then break end
      redis.call('LPOP', line)
      redis.call('HDEL', waiters, w)
      if w == token and op == 'a' then
        mine = give(w, wn, tonumber(ARGV[3]))
      else
        -- Until the new holder renews, its lease lasts no longer than its
        -- place in line would have: a waiter that died in line costs little.
        local f = give(w, wn, math.min(tonumber(wttl), 2 * (tonumber(dl) - now) + 1000))
        redis.call('SPUBLISH', wch, 'g ' .. fmt(f) .. ' ' .. w)
      end
    else
      redis.call('LPOP', line)
      redis.call('HDEL', waiters, w)
    end
  end
  return mine
end

-- Store the counters and set expiries: the state lives as long as its
-- longest lease, the fence and size for the idle period after that.
local function settle(idle)
  redis.call('HSET', main, 'u', fmt(used), 'f', fmt(fence))
  local last = redis.call('ZRANGE', holders, -1, -1, 'WITHSCORES')
  local keep = idle
  if last[2] then keep = math.max(tonumber(last[2]) - now, 0) + idle end
  redis.call('PEXPIRE', main, keep)
  if last[2] then
    redis.call('PEXPIRE', holders, keep)
    redis.call('PEXPIRE', holdings, keep)
  end
end

-- Remove token's holding; returns whether it had one.
local function drop()
  local v = redis.call('HGET', holdings, token)
  if not v then return false end
  used = used - tonumber(string.match(v, '^(%d+)'))
  redis.call('HDEL', holdings, token)
  redis.call('ZREM', holders, token)
  return true
end

if op == 'a' then
  local ttl, live, join, ch, n, want, kind, idle =
    tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5], ARGV[6], tonumber(ARGV[7]), tonumber(ARGV[8]), ARGV[9], ARGV[10]
  if st[1] ~= kind then
    if st[1] then return redis.error_reply('DLOCK_FOREIGN dlock ' .. st[1]) end
    if redis.call('EXISTS', main) == 1 then
      if st[4] then return redis.error_reply('DLOCK_FOREIGN dlock mutex') end
      return redis.error_reply('DLOCK_FOREIGN hash')
    end
  end
  prune()
  if size ~= want then
    -- Another size is adopted only when nobody holds or waits.
    if size and (used > 0 or redis.call('LLEN', line) > 0) then
      return redis.error_reply('DLOCK_SIZE ' .. fmt(size))
    end
    size = want
    redis.call('HSET', main, 'k', kind, 's', fmt(size))
  end
  local mine = serve()
  if not mine then
    local v = redis.call('HGET', holdings, token)
    if v then
      -- Handed over while we waited, or a retry whose reply was lost: ours.
      redis.call('ZADD', holders, 'XX', now + ttl, token)
      mine = tonumber(string.match(v, ',(%d+)$'))
    elseif redis.call('LLEN', line) == 0 and used + n <= size then
      mine = give(token, n, ttl)
    end
  end
  if mine then
    settle(idle)
    return {1, mine}
  end
  -- How long until a holding ends (the soonest lease deadline) at most.
  local first = redis.call('ZRANGE', holders, 0, 0, 'WITHSCORES')
  local wait = live
  if first[2] then wait = math.max(tonumber(first[2]) - now, 1) end
  if join == '1' then
    wait = math.min(wait, live)
    if redis.call('HSET', waiters, token, fmt(now + live) .. ',' .. fmt(ttl) .. ',' .. ch .. ',' .. fmt(n)) == 1 then
      redis.call('RPUSH', line, token)
    end
    redis.call('PEXPIRE', line, 2 * live)
    redis.call('PEXPIRE', waiters, 2 * live)
  end
  settle(idle)
  return {0, wait, fence}
elseif op == 'r' or op == 'l' then
  if not size then return 0 end
  prune()
  local held = drop()
  if not held then
    if op == 'r' then return 0 end
    redis.call('LREM', line, 1, token)
    redis.call('HDEL', waiters, token)
  end
  serve()
  settle(ARGV[3])
  if held then return 1 end
  return 0
elseif op == 'e' then
  if not size then return 0 end
  local dl = redis.call('ZSCORE', holders, token)
  if not dl or tonumber(dl) <= now then return 0 end
  redis.call('ZADD', holders, 'XX', now + tonumber(ARGV[3]), token)
  settle(ARGV[4])
  return 1
elseif op == 't' then
  if not size then return -1 end
  local dl = redis.call('ZSCORE', holders, token)
  if not dl or tonumber(dl) <= now then return -1 end
  return tonumber(dl) - now
end
return redis.error_reply('DLOCK_OP unknown operation ' .. tostring(op))
