-- quorum_epoch.lua: set a quorum master's epoch key, if it has none, to
-- when its data began: now less its uptime (see quorum_acquire.lua). One
-- script, so that a restart between reading the uptime and writing the key
-- cannot lend a new master the old one's age.
-- KEYS[1]  the master's epoch key
-- Returns  1 set; 0 it was set already
-- Errors   DLOCK_EPOCH <what>  INFO server has no uptime
local up = tonumber(string.match(redis.call('INFO', 'server'), 'uptime_in_seconds:(%d+)'))
if not up then return redis.error_reply('DLOCK_EPOCH INFO server has no uptime_in_seconds') end
local t = redis.call('TIME')
-- The uptime is the difference of two clocks in whole seconds (now and the
-- start, each rounded down), so it may exceed the real one by up to a
-- second: counting one second less (and the start no later than now) keeps
-- the start computed no earlier than the real one.
local start = t[1] * 1000 + math.floor(t[2] / 1000) - math.max(up - 1, 0) * 1000
if redis.call('SET', KEYS[1], string.format('%.0f', start), 'NX') then return 1 end
return 0
