-- pttl.lua: remaining lease time of the owner token.
-- KEYS[1]  the lock hash
-- ARGV[1]  owner token
-- Returns  remaining microseconds (> 0), or -1 if the token no longer holds the lock
local h = redis.call('HMGET', KEYS[1], 'o', 'e')
if h[1] ~= ARGV[1] then return -1 end
local t = redis.call('TIME')
local left = tonumber(h[2]) - (t[1] * 1000000 + t[2])
if left <= 0 then return -1 end
return left
