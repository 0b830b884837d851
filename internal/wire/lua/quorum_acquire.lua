-- quorum_acquire.lua: one master's vote in quorum mode (see quorum.go). The
-- script is this check followed by acquire.lua (internal/wire joins them),
-- which takes the mutex without a line: only on a master whose data this
-- process has kept for the restart delay, since data that came through a
-- restart or a failover may lack a lease granted before, which must not be
-- granted again while it may still be believed valid.
-- KEYS[1]  the lock hash (o = owner token, f = last fence), as acquire.lua
-- KEYS[2]  the master's epoch key: "START RUN_ID", since when (server ms)
--          the process RUN_ID has held these data (acquire.lua, given no
--          KEYS[3], takes no place in line and does not read it)
-- ARGV[1]  owner token
-- ARGV[2]  lease TTL in milliseconds
-- ARGV[3]  restart delay in milliseconds (0: no check)
-- ARGV[4]  a proposed fence (0: none), as acquire.lua without a line
-- Returns {1, fence}            acquired
--         {1, fence, 1}         the token already held it (a retry)
--         {0, remaining_ms, f}  held by another owner (fence f)
--         {2, wait_ms}          not voting for wait_ms more
-- Errors  DLOCK_FOREIGN <what>  the key exists but is not a dlock mutex
local delay = tonumber(ARGV[3])
if delay > 0 then
  local t = redis.call('TIME')
  local now = t[1] * 1000 + math.floor(t[2] / 1000)
  local info = redis.call('INFO', 'server')
  local run = string.match(info, 'run_id:(%x+)')
  local e = redis.call('GET', KEYS[2])
  local start, erun
  if e then start, erun = string.match(e, '^(%d+) (%x+)$') end
  if erun ~= run then
    if e then
      -- Another process's key: these data came through a restart (from a
      -- snapshot, or an AOF that may lack its last writes) or a failover
      -- (a replica that may lag): what they lack was granted before now.
      start = now
    else
      -- No key: new data (a new master, or a restart without them),
      -- begun when this process started. Uptime is the difference of two
      -- whole-second clocks, up to a second above the real one.
      -- Negative once the clock went back past the start: the start is
      -- then ahead of the clock, and the master waits until it has passed.
      start = now - tonumber(string.match(info, 'uptime_in_seconds:(-?%d+)')) * 1000 + 1000
    end
    redis.call('SET', KEYS[2], string.format('%.0f %s', start, run))
  end
  local since = now - tonumber(start)
  if since < delay then return {2, delay - since} end
end
