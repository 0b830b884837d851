-- release.lua: give a mutex up if this token still owns it: hand it straight
-- to the first live waiter in its line and tell that waiter so, or, with
-- nobody alive in line, free it and wake waiters.
-- KEYS[1]  the lock hash (o, f; p = the fence of the holder that last handed
--          it over; w = someone may be in line: only then is the line looked at)
-- KEYS[2]  the line, KEYS[3] the waiters (see acquire.lua, fair_acquire.lua);
--          optional: with KEYS[1] alone the lock is freed without a hand-over
-- ARGV[1]  owner token
-- ARGV[2]  the fence this token was granted
-- ARGV[3]  idle period in milliseconds: how long the fence outlives the holder
-- ARGV[4]  wake-up channel (the key's name, so the key's slot); the message
--          is the released fence, so waiters can tell a release of the holder
--          they saw from an older one
-- ARGV[5]  the publish command: SPUBLISH (also when absent), or PUBLISH on a
--          server without sharded pub/sub (see wire.PublishPlain)
-- Returns  3  handed over to the next waiter: published "g FENCE TOKEN" on
--             that waiter's own channel (only its Client wakes up), and,
--             for an election (the hash has vf), "h FENCE" on the
--             election's channel KEYS[1]:e
--          1  released, nobody alive in line: published the released fence
--          2  already released or handed over by this same holding (a retry)
--          0  not the owner: the lease was lost (expired, taken, or deleted)
-- Errors   DLOCK_ARG <what>  ARGV[5] is not a publish command
local key, token = KEYS[1], ARGV[1]
local pub = ARGV[5] or 'SPUBLISH'
if pub ~= 'SPUBLISH' and pub ~= 'PUBLISH' then return redis.error_reply('DLOCK_ARG publish command ' .. pub) end
local h = redis.call('HMGET', key, 'o', 'f', 'p', 'w')
if h[1] ~= token then
  -- The fence changes only with a new grant: no owner and our fence means
  -- nobody took the lock after us, so our earlier release went through; p
  -- equal to our fence means we handed it over.
  if (not h[1] and h[2] == ARGV[2]) or h[3] == ARGV[2] then return 2 end
  return 0
end
if KEYS[3] and h[4] then
  local line, waiters = KEYS[2], KEYS[3]
  local w = redis.call('LPOP', line)
  local t, now
  while w do
    local v = redis.call('HGET', waiters, w)
    redis.call('HDEL', waiters, w)
    if v then
      if not t then
        t = redis.call('TIME')
        now = t[1] * 1000 + math.floor(t[2] / 1000)
      end
      local deadline, wttl, wch = string.match(v, '^(%d+),(%d+),?(.*)$')
      if wch == '' then wch = ARGV[4] end -- no channel of its own: the lock's
      if deadline and tonumber(deadline) > now then
        local f = math.max(tonumber(h[2]) + 1, t[1] * 1000000 + t[2])
        local fs = string.format('%.0f', f)
        -- Until the new holder renews, the lock lives no longer than a
        -- waiter's place would: a waiter that died in line costs at most that.
        redis.call('HSET', key, 'o', w, 'f', fs, 'p', ARGV[2])
        redis.call('PEXPIRE', key, math.min(tonumber(wttl), 2 * (tonumber(deadline) - now) + 1000))
        redis.pcall(pub, wch, 'g ' .. fs .. ' ' .. w) -- see the note below
        -- An election's lock (its hash holds a leader's value): the leader
        -- changed, and nobody leads until the new holder proclaims, which
        -- it may never do. Its observers are told on the election's
        -- channel (wire.ElectionChannel, in the key's slot).
        if redis.call('HGET', key, 'vf') then redis.pcall(pub, key .. ':e', 'h ' .. fs) end
        return 3
      end
    end
    w = redis.call('LPOP', line)
  end
end
redis.call('HDEL', key, 'o', 'w')
redis.call('PEXPIRE', key, ARGV[3])
-- pcall: the wake-up is not part of the release. A refused publish (an ACL
-- without channel rights, a server that lost SPUBLISH) must not fail the
-- script after its writes, which Redis keeps: the caller would be told that
-- a release it made had failed. Waiters then learn of it at their next look.
redis.pcall(pub, ARGV[4], ARGV[2])
return 1
