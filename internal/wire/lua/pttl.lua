-- pttl.lua: remaining lease time of the owner token.
-- KEYS[1]  the lock hash
-- ARGV[1]  owner token
-- Returns  remaining milliseconds, or -1 if the token no longer holds the lock
if redis.call('HGET', KEYS[1], 'o') ~= ARGV[1] then return -1 end
return redis.call('PTTL', KEYS[1])
