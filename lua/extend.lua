-- extend.lua: push a held lease's deadline to now + TTL. Never revives a lock
-- that expired or changed hands.
-- KEYS[1]  the lock hash
-- ARGV[1]  owner token
-- ARGV[2]  new TTL in milliseconds
-- ARGV[3]  idle period in milliseconds
-- Returns  1 extended, 0 not the owner or already expired
local key, token = KEYS[1], ARGV[1]
local ttl = tonumber(ARGV[2])
local h = redis.call('HMGET', key, 'o', 'e')
if h[1] ~= token then return 0 end
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
if tonumber(h[2]) <= now then return 0 end
redis.call('HSET', key, 'e', string.format('%.0f', now + ttl * 1000))
redis.call('PEXPIRE', key, ttl + tonumber(ARGV[3]))
return 1
