-- pass.lua: record at Redis that a holder passed a default-mode mutex to
-- another waiter of its own Client (see Client.pass in pass.go). The new
-- holder started at once, covered by the old holder's lease until this runs;
-- its fence is the old one plus one, chosen by the Client, so that it is
-- known before this round trip and still above every fence granted before
-- and below every fence granted after (acquire.lua takes the larger of
-- f + 1 and the server clock).
-- KEYS[1]  the lock hash (o, f, p; see release.lua)
-- KEYS[2]  the line, KEYS[3] the waiters (the new holder leaves them)
-- ARGV[1]  the old holder's token, ARGV[2] its fence
-- ARGV[3]  the new holder's token, ARGV[4] its fence (ARGV[2] + 1)
-- ARGV[5]  the new holder's TTL in milliseconds
-- Returns  1  passed (or already passed: a retry); either way the lock now
--             expires ARGV[5] ms after this call, so that the new holder
--             may date its lease from the send of whichever call replied
--          2  passed, as 1, and nobody waits in the line: no other Client
--             waits for a turn, so this Client's may go on
--          0  the old holder no longer owned the lock: its lease had been
--             lost, so the new holder never held it either
local key = KEYS[1]
local h = redis.call('HMGET', key, 'o', 'f')
if h[1] == ARGV[3] and h[2] == ARGV[4] then
  redis.call('PEXPIRE', key, ARGV[5])
  return 1
end
if h[1] ~= ARGV[1] or h[2] ~= ARGV[2] then return 0 end
if redis.call('HDEL', KEYS[3], ARGV[3]) == 1 then
  redis.call('LREM', KEYS[2], 1, ARGV[3])
end
redis.call('HSET', key, 'o', ARGV[3], 'f', ARGV[4], 'p', ARGV[2])
redis.call('PEXPIRE', key, ARGV[5])
if redis.call('LLEN', KEYS[2]) == 0 then return 2 end
return 1
