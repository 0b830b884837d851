-- release.lua: give a mutex up if this token still owns it, and wake waiters.
-- KEYS[1]  the lock hash
-- ARGV[1]  owner token
-- ARGV[2]  the fence this token was granted
-- ARGV[3]  idle period in milliseconds: how long the fence outlives the holder
-- ARGV[4]  wake-up channel (sharded pub/sub; the key's name, so the key's slot);
--          the message is the released fence, so waiters can tell a release of
--          the holder they saw from an older one
-- Returns  1  released
--          2  already released by this same holding (a retried release)
--          0  not the owner: the lease was lost (expired, taken, or deleted)
local key, token = KEYS[1], ARGV[1]
local h = redis.call('HMGET', key, 'o', 'f')
if h[1] ~= token then
  -- The fence changes only with a new grant: no owner and our fence means
  -- nobody took the lock after us, so our earlier release went through.
  if not h[1] and h[2] == ARGV[2] then return 2 end
  return 0
end
redis.call('HDEL', key, 'o')
redis.call('PEXPIRE', key, ARGV[3])
redis.call('SPUBLISH', ARGV[4], ARGV[2])
return 1
