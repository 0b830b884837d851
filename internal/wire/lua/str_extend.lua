-- str_extend.lua: make a held string lease end TTL from now
-- (compare-and-PEXPIRE). Never revives a lock that expired or changed hands.
-- KEYS[1]  the lock key;  KEYS[2] its fence counter
-- ARGV[1]  owner token
-- ARGV[2]  new TTL in milliseconds
-- ARGV[3]  idle period in milliseconds (the counter lives TTL + this)
-- Returns  1 extended, 0 not the owner
-- Errors   DLOCK_FOREIGN <type>  the key is no longer a string
local t = redis.call('TYPE', KEYS[1])['ok']
if t ~= 'string' and t ~= 'none' then return redis.error_reply('DLOCK_FOREIGN ' .. t) end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[2]) + tonumber(ARGV[3]))
return 1
