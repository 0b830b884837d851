-- extend.lua: make a held lease end TTL from now. Never revives a lock that
-- expired or changed hands.
-- KEYS[1]  the lock hash
-- ARGV[1]  owner token
-- ARGV[2]  new TTL in milliseconds
-- Returns  1 extended, 0 not the owner
if redis.call('HGET', KEYS[1], 'o') ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
