-- str_pttl.lua: remaining lease time of the owner token of a string lock.
-- KEYS[1]  the lock key
-- ARGV[1]  owner token
-- Returns  remaining milliseconds, or -1 if the token no longer holds the lock
-- Errors   DLOCK_FOREIGN <type>  the key is no longer a string
local t = redis.call('TYPE', KEYS[1])['ok']
if t ~= 'string' and t ~= 'none' then return redis.error_reply('DLOCK_FOREIGN ' .. t) end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
return redis.call('PTTL', KEYS[1])
