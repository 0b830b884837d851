-- release.lua: give a mutex up if this token still owns it, and wake waiters.
-- KEYS[1]  the lock hash
-- ARGV[1]  owner token
-- ARGV[2]  the fence this token was granted
-- ARGV[3]  idle period in milliseconds
-- ARGV[4]  wake-up channel (sharded pub/sub, same slot as the key)
-- Returns  1  released
--          2  already released by this same holding (a retried release)
--          0  not the owner: the lease was lost (expired and taken, or deleted)
--         -1  still the owner but the lease had expired: released, reported as lost
local key, token = KEYS[1], ARGV[1]
local h = redis.call('HMGET', key, 'o', 'e', 'f')
if h[1] ~= token then
  -- The fence is only bumped by a new acquire: no owner and our fence means
  -- nobody took the lock after us, so our earlier release went through.
  if not h[1] and h[3] == ARGV[2] then return 2 end
  return 0
end
redis.call('HDEL', key, 'o', 'e')
redis.call('PEXPIRE', key, tonumber(ARGV[3]))
redis.call('SPUBLISH', ARGV[4], 'r')
local t = redis.call('TIME')
if tonumber(h[2]) <= t[1] * 1000000 + t[2] then return -1 end
return 1
