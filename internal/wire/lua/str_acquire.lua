-- str_acquire.lua: take a string lock (StringMutex) if it is free: the
-- format of redsync, redis-py's Lock, node-redlock and bsm/redislock (SET
-- key value NX PX ttl), plus a fence from a counter hash beside it, in one
-- script. Other libraries never read the counter; they see a string key
-- holding a random value, as their own.
-- KEYS[1]  the lock key, as the user gave it: a string holding the owner's value
-- KEYS[2]  the fence counter (wire.StringFenceKey, in KEYS[1]'s slot): a hash,
--          f = the last fence granted, o = the token of the holding that has
--          it (while held), r = the last fence released
-- ARGV[1]  owner token (dlock's value at the key)
-- ARGV[2]  lease TTL in milliseconds
-- ARGV[3]  idle period in milliseconds: how long the counter outlives a lease
-- Returns {1, fence}           acquired
--         {1, fence, 1}        the token already held it (a retry after a lost reply)
--         {0, remaining_ms, f} held, for remaining_ms more (-1: no expiry);
--                              f is the holder's fence if it is a dlock
--                              holding, else one above the last fence
--                              (no dlock holding has it)
-- Errors  DLOCK_FOREIGN <type> the key (or the counter) is not of its type
local key, ctr, token, ttl = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
local t = redis.call('TYPE', key)['ok']
if t ~= 'string' and t ~= 'none' then return redis.error_reply('DLOCK_FOREIGN ' .. t) end
local ct = redis.call('TYPE', ctr)['ok']
if ct ~= 'hash' and ct ~= 'none' then return redis.error_reply('DLOCK_FOREIGN ' .. ct .. ' fence counter') end
local c = redis.call('HMGET', ctr, 'f', 'o')
local last = tonumber(c[1]) or 0
if t == 'string' then
  local v = redis.call('GET', key)
  if v == token then
    -- A retry of an acquire whose reply was lost. Idempotent.
    redis.call('PEXPIRE', key, ttl)
    return {1, last, 1}
  end
  if c[2] ~= v then last = last + 1 end -- another library's holder: it has no fence
  return {0, redis.call('PTTL', key), last}
end
-- Free. Fences never go backwards: one more than the last, and never below
-- the server clock in microseconds (as acquire.lua: the counter may have
-- expired after the idle period, or been lost).
-- First a DEL of the key, which is absent (a no-op, not replicated): a user
-- whose ACL lacks DEL could take the lock but never release it (the release
-- is a compare-and-delete), so it is refused here, before anything is set.
redis.call('DEL', key)
local now = redis.call('TIME')
local f = math.max(last + 1, now[1] * 1000000 + now[2])
local fs = string.format('%.0f', f)
redis.call('SET', key, token, 'PX', ttl)
redis.call('HSET', ctr, 'f', fs, 'o', token)
redis.call('HDEL', ctr, 'r')
redis.call('PEXPIRE', ctr, tonumber(ttl) + tonumber(ARGV[3]))
return {1, f}
