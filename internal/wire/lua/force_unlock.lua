-- force_unlock.lua: "dlock unlock --force": remove a mutex's holder, for
-- operators, as a release by that holder would except that it hands nothing
-- to the Fair line (Fair waiters take the lock at their next look).
-- KEYS[1]  the lock hash: o = owner token, f = last fence (docs/PROTOCOL.md)
-- ARGV[1]  idle period in milliseconds: how long the fence counter outlives
--          the holder (as in release.lua)
-- ARGV[2]  wake-up channel (the key's name); the message is the fence
-- ARGV[3]  the token that must be the holder, or "" for whoever holds it
-- ARGV[4]  the publish command: SPUBLISH (also when absent) or PUBLISH (as in
--          release.lua)
-- Returns  {1, token, fence}  removed that holder
--          {0, fence}         not held ("" when there is no key)
--          {2, token, fence}  held by another token than ARGV[3]; unchanged
-- Errors   DLOCK_FOREIGN <what>  the key is not a dlock mutex
--          DLOCK_ARG <what>      ARGV[4] is not a publish command
-- The fence counter is kept and moved on by one, so fences keep increasing
-- and the removed holder's own Unlock reports the loss (release.lua takes
-- "no owner, fence unchanged" for its own earlier release).
local key = KEYS[1]
local pub = ARGV[4] or 'SPUBLISH'
if pub ~= 'SPUBLISH' and pub ~= 'PUBLISH' then return redis.error_reply('DLOCK_ARG publish command ' .. pub) end
local h = redis.call('HMGET', key, 'o', 'f', 'k')
if h[3] then return redis.error_reply('DLOCK_FOREIGN dlock ' .. h[3]) end
if not h[2] then
  if redis.call('EXISTS', key) == 1 then return redis.error_reply('DLOCK_FOREIGN hash') end
  return {0, ''}
end
-- Everything is checked before the first write: a script that fails
-- after a write keeps it, and a key that is not a dlock mutex is never
-- modified.
if not string.match(h[2], '^%d+$') then return redis.error_reply('DLOCK_FOREIGN hash') end
if not h[1] then return {0, h[2]} end
if ARGV[3] ~= '' and h[1] ~= ARGV[3] then return {2, h[1], h[2]} end
redis.call('HDEL', key, 'o')
redis.call('HSET', key, 'f', string.format('%.0f', tonumber(h[2]) + 1))
redis.call('PEXPIRE', key, ARGV[1])
redis.pcall(pub, ARGV[2], h[2]) -- pcall: see release.lua
return {1, h[1], h[2]}
