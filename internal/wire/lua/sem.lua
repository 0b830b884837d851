-- sem.lua: a weighted FIFO semaphore whose every holding is a lease; the
-- read-write lock is the same thing with readers taking 1 permit and writers
-- all of them. One script, several operations, so the rules live in one place.
-- KEYS[1]  the semaphore hash: k = kind, s = size, u = permits held, f = last
--          fence, q = 1 while someone may be in line, and per holding
--          "h:TOKEN" -> "permits,fence"
-- KEYS[2]  holders: sorted set token -> lease deadline (server ms)
-- KEYS[3]  the line: list of waiter tokens in arrival order
-- KEYS[4]  the waiters: hash token -> "deadline_ms,ttl_ms,permits,channel"
--          (the channel last: a lock name may contain any byte, commas too)
-- ARGV[1]  the operation:
--   a token ttl live join channel n size kind idle pub   acquire (or keep a place in line)
--   r token idle pub                                     release
--   l token idle pub                                     leave the line, or release if granted
--   e token ttl idle                                     extend a holding
--   t token                                              remaining ms of a holding
--   (pub: the publish command for hand-overs, SPUBLISH, also when absent, or
--   PUBLISH on a server without sharded pub/sub; see release.lua)
-- Replies: a -> {1, fence} held; {1, fence, 1} already held (handed over, or
--               a retry); {0, wait_ms, fence} not (in line if join = "1")
--          r -> 1 released, 0 not a holder (lost)
--          l -> 1 was a holder and released, 0 left the line
--          e -> 1 extended, 0 not a holder;  t -> ms, or -1 if not a holder
-- Errors:  DLOCK_FOREIGN <what>   the key is not a dlock lock of this kind
--          DLOCK_SIZE <size>      the semaphore is in use with another size
--          DLOCK_ARG <what>       pub is not a publish command
-- The common paths are kept short (6 commands to take a free permit, 4 to
-- give one back): the clock is read, the line looked at and expired holdings
-- pruned only when needed. An expired holding that was not pruned yet still
-- counts: its permits were never given to anyone else, so its owner may
-- still release (or, handed over, take) them.
local main, holders, line, waiters = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local op, token = ARGV[1], ARGV[2]
local pub = (op == 'a' and ARGV[11]) or ((op == 'r' or op == 'l') and ARGV[4]) or 'SPUBLISH'
if pub ~= 'SPUBLISH' and pub ~= 'PUBLISH' then return redis.error_reply('DLOCK_ARG publish command ' .. pub) end
local st = redis.call('HMGET', main, 'k', 's', 'u', 'f', 'h:' .. token, 'q')
local size, used, fence = tonumber(st[2]), tonumber(st[3]) or 0, tonumber(st[4]) or 0
local held = st[5] -- "permits,fence" if token holds permits

local now, nowus
local function clock()
  if not now then
    local t = redis.call('TIME')
    now = t[1] * 1000 + math.floor(t[2] / 1000)
    nowus = t[1] * 1000000 + t[2]
  end
  return now
end

local function fmt(x) return string.format('%.0f', x) end
local function permits(v) return tonumber(string.match(v, '^(%d+)')) end

-- A holding's lease ran out once the clock in ms is past its deadline, not
-- at it: the deadline counts from the clock truncated to the ms, up to 1 ms
-- before the grant ran (as for a key's own expiry, which Redis ends only
-- when its clock is past it).
local function ran_out(dl) return tonumber(dl) < clock() end

-- Drop holdings whose lease ran out (at most 1000 per call): their permits
-- come back. Done only when permits are short or the size is to change.
local pruned = false
local function prune()
  if pruned then return end
  pruned = true
  local gone = redis.call('ZRANGEBYSCORE', holders, '-inf', '(' .. clock(), 'LIMIT', 0, 1000)
  if #gone == 0 then return end
  local fields = {}
  for i, g in ipairs(gone) do fields[i] = 'h:' .. g end
  for _, v in ipairs(redis.call('HMGET', main, unpack(fields))) do
    if v then used = used - permits(v) end
  end
  redis.call('HDEL', main, unpack(fields))
  redis.call('ZREM', holders, unpack(gone))
  redis.call('HSET', main, 'u', fmt(used))
end

local function fits(n)
  if used + n <= size then return true end
  prune()
  return used + n <= size
end

-- Make tok a holder of n permits for ttl ms; returns its fence.
local gave = false
local function give(tok, n, ttl)
  clock()
  fence = math.max(fence + 1, nowus)
  used = used + n
  gave = true
  redis.call('ZADD', holders, now + ttl, tok)
  redis.call('HSET', main, 'h:' .. tok, fmt(n) .. ',' .. fmt(fence), 'u', fmt(used), 'f', fmt(fence))
  return fence
end

-- Hand permits to the live waiters at the head of the line, in order, while
-- they fit; a head that does not fit blocks those behind it (FIFO). Dead
-- heads are dropped. Returns the fence if the caller (token) was granted,
-- and whether a live waiter is still in line.
local function serve()
  local mine
  if not st[6] then return nil, false end
  while true do
    local w = redis.call('LINDEX', line, 0)
    if not w then
      redis.call('HDEL', main, 'q')
      st[6] = false
      return mine, false
    end
    local v = redis.call('HGET', waiters, w)
    local dl, wttl, wch, wn
    if v then dl, wttl, wn, wch = string.match(v, '^(%d+),(%d+),(%d+),(.*)$') end
    if dl and tonumber(dl) > clock() then
      wn = tonumber(wn)
      if not fits(wn) then return mine, true end
      redis.call('LPOP', line)
      redis.call('HDEL', waiters, w)
      if w == token and op == 'a' then
        mine = give(w, wn, tonumber(ARGV[3]))
      else
        -- Until the new holder renews, its lease lasts no longer than its
        -- place in line would have: a waiter that died in line costs little.
        local f = give(w, wn, math.min(tonumber(wttl), 2 * (tonumber(dl) - now) + 1000))
        redis.pcall(pub, wch, 'g ' .. fmt(f) .. ' ' .. w) -- pcall: see release.lua
      end
    else
      redis.call('LPOP', line)
      redis.call('HDEL', waiters, w)
    end
  end
end

-- After a grant or an extension: the state lives as long as its longest
-- lease, and the fence and size for the idle period after that. (A grant to
-- the only holder knows that length without asking.)
local function outlive(idle, only)
  local keep = only
  if not keep then
    local last = redis.call('ZRANGE', holders, -1, -1, 'WITHSCORES')
    keep = math.max(tonumber(last[2]) - clock(), 0)
  end
  keep = keep + idle
  redis.call('PEXPIRE', main, keep)
  redis.call('PEXPIRE', holders, keep)
end

-- Give token's permits back.
local function drop()
  used = used - permits(held)
  redis.call('HDEL', main, 'h:' .. token)
  redis.call('ZREM', holders, token)
  redis.call('HSET', main, 'u', fmt(used))
end

if op == 'a' then
  local ttl, live, join, ch, n, want, kind, idle =
    tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5], ARGV[6], tonumber(ARGV[7]), tonumber(ARGV[8]), ARGV[9], tonumber(ARGV[10])
  if st[1] ~= kind then
    if st[1] then return redis.error_reply('DLOCK_FOREIGN dlock ' .. st[1]) end
    if redis.call('EXISTS', main) == 1 then
      if st[4] then return redis.error_reply('DLOCK_FOREIGN dlock mutex') end
      return redis.error_reply('DLOCK_FOREIGN hash')
    end
  end
  if size ~= want then
    -- Another size is adopted only when nobody holds or waits.
    prune()
    if size and (used > 0 or redis.call('LLEN', line) > 0) then
      return redis.error_reply('DLOCK_SIZE ' .. fmt(size))
    end
    size = want
    redis.call('HSET', main, 'k', kind, 's', fmt(size))
  end
  if held then
    -- Handed over while we waited, or a retry whose reply was lost: ours.
    redis.call('ZADD', holders, 'XX', clock() + ttl, token)
    outlive(idle)
    return {1, tonumber(string.match(held, ',(%d+)$')), 1}
  end
  local first = used == 0
  local mine, waiting = serve()
  if not mine and not waiting and fits(n) then
    mine = give(token, n, ttl)
    -- A grant always takes the grantee out of the line: a place left
    -- behind (the q flag lost with the hash) would be served again.
    -- (Only a call that joins the line can have a place in it.)
    if join == '1' and redis.call('HDEL', waiters, token) == 1 then redis.call('LREM', line, 1, token) end
  end
  if gave then
    if first and mine and used == n then outlive(idle, ttl) else outlive(idle) end
  end
  if mine then return {1, mine} end
  -- How long until a holding ends (the soonest lease deadline) at most.
  local first = redis.call('ZRANGE', holders, 0, 0, 'WITHSCORES')
  local wait = live
  if first[2] then wait = math.max(tonumber(first[2]) - clock(), 1) end
  if join == '1' then
    wait = math.min(wait, live)
    if redis.call('HSET', waiters, token, fmt(clock() + live) .. ',' .. fmt(ttl) .. ',' .. fmt(n) .. ',' .. ch) == 1 then
      redis.call('RPUSH', line, token)
    end
    if not st[6] then redis.call('HSET', main, 'q', '1') end
    redis.call('PEXPIRE', line, 2 * live)
    redis.call('PEXPIRE', waiters, 2 * live)
  end
  return {0, wait, fence}
elseif op == 'r' or op == 'l' then
  if not size then return 0 end
  local had = held
  if had then
    drop()
  elseif op == 'l' then
    redis.call('LREM', line, 1, token)
    redis.call('HDEL', waiters, token)
  end
  serve()
  if gave then outlive(tonumber(ARGV[3])) end
  if had then return 1 end
  return 0
elseif op == 'e' then
  if not size or not held then return 0 end
  local dl = redis.call('ZSCORE', holders, token)
  if not dl or ran_out(dl) then return 0 end
  redis.call('ZADD', holders, 'XX', now + tonumber(ARGV[3]), token)
  outlive(tonumber(ARGV[4]))
  return 1
elseif op == 't' then
  if not size or not held then return -1 end
  local dl = redis.call('ZSCORE', holders, token)
  if not dl or ran_out(dl) then return -1 end
  return tonumber(dl) - now
end
return redis.error_reply('DLOCK_OP unknown operation ' .. tostring(op))
