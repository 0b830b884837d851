-- fair_leave.lua: a waiter gives up its place in a Fair() mutex's line.
-- KEYS[1]  the lock hash;  KEYS[2] the line;  KEYS[3] the waiters
-- ARGV[1]  the waiter's token
-- Returns  {1, fence}  the lock had already been handed to this waiter: it
--                      holds it and must release it
--          {0}         left the line
local h = redis.call('HMGET', KEYS[1], 'o', 'f')
if h[1] == ARGV[1] then return {1, tonumber(h[2])} end
redis.call('LREM', KEYS[2], 1, ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
return {0}
