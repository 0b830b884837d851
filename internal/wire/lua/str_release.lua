-- str_release.lua: give a string lock (StringMutex) up if this token still
-- owns it: compare-and-delete, as the other libraries release theirs.
-- KEYS[1]  the lock key;  KEYS[2] its fence counter (see str_acquire.lua)
-- ARGV[1]  owner token
-- ARGV[2]  the fence this token was granted ("0": unknown, a give-back)
-- ARGV[3]  idle period in milliseconds: how long the counter outlives the holder
-- ARGV[4]  wake-up channel (the key's name, so the key's slot); the message
--          is the released fence
-- ARGV[5]  the publish command: SPUBLISH or PUBLISH (see release.lua)
-- Returns  1  released: deleted, published the released fence
--          2  already released by this same holding (a retry)
--          0  not the owner: the lease was lost (expired, deleted, overwritten)
-- Errors   DLOCK_FOREIGN <type>  the key is not a string
--          DLOCK_ARG <what>      ARGV[5] is not a publish command
local key, ctr, token = KEYS[1], KEYS[2], ARGV[1]
local pub = ARGV[5] or 'SPUBLISH'
if pub ~= 'SPUBLISH' and pub ~= 'PUBLISH' then return redis.error_reply('DLOCK_ARG publish command ' .. pub) end
local t = redis.call('TYPE', key)['ok']
if t ~= 'string' and t ~= 'none' then return redis.error_reply('DLOCK_FOREIGN ' .. t) end
if t == 'none' or redis.call('GET', key) ~= token then
  -- r is set only by a release: our fence there means we released it
  -- (an expiry leaves it unset).
  if ARGV[2] ~= '0' and redis.call('HGET', ctr, 'r') == ARGV[2] then return 2 end
  return 0
end
redis.call('DEL', key)
local f = redis.call('HGET', ctr, 'f') or ARGV[2]
if redis.call('HGET', ctr, 'o') == token then
  redis.call('HDEL', ctr, 'o')
  redis.call('HSET', ctr, 'r', f)
  redis.call('PEXPIRE', ctr, ARGV[3])
end
-- pcall: the wake-up is not part of the release (see release.lua).
redis.pcall(pub, ARGV[4], f)
return 1
