-- fair_release.lua: give a Fair() mutex up, handing it straight to the first
-- live waiter in line, and tell it so.
-- KEYS[1]  the lock hash;  KEYS[2] the line;  KEYS[3] the waiters (see fair_acquire.lua)
-- ARGV[1]  owner token
-- ARGV[2]  the fence this token was granted
-- ARGV[3]  idle period in milliseconds
-- ARGV[4]  wake-up channel
-- Returns  3  handed over to the next waiter: published "g FENCE TOKEN" on
--             that waiter's own channel (only its Client wakes up)
--          1  released, nobody waiting: published the released fence
--          2  already released or handed over by this same holding (a retry)
--          0  not the owner: the lease was lost
local key, line, waiters = KEYS[1], KEYS[2], KEYS[3]
local token = ARGV[1]
local h = redis.call('HMGET', key, 'o', 'f', 'p')
if h[1] ~= token then
  if (not h[1] and h[2] == ARGV[2]) or h[3] == ARGV[2] then return 2 end
  return 0
end
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
while true do
  local w = redis.call('LPOP', line)
  if not w then break end
  local v = redis.call('HGET', waiters, w)
  redis.call('HDEL', waiters, w)
  if v then
    local deadline, wttl, wch = string.match(v, '^(%d+),(%d+),?(.*)$')
    if wch == '' then wch = ARGV[4] end -- no channel of its own: the lock's
    if deadline and tonumber(deadline) > now then
      local f = math.max(tonumber(h[2]) + 1, t[1] * 1000000 + t[2])
      local fs = string.format('%.0f', f)
      -- Until the new holder renews, the lock lives no longer than a
      -- waiter's place would: a waiter that died in line costs at most that.
      redis.call('HSET', key, 'o', w, 'f', fs, 'p', ARGV[2])
      redis.call('PEXPIRE', key, math.min(tonumber(wttl), 2 * (tonumber(deadline) - now) + 1000))
      redis.call('SPUBLISH', wch, 'g ' .. fs .. ' ' .. w)
      return 3
    end
  end
end
redis.call('HDEL', key, 'o')
redis.call('PEXPIRE', key, ARGV[3])
redis.call('SPUBLISH', ARGV[4], ARGV[2])
return 1
