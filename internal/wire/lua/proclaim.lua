-- proclaim.lua: publish an election leader's value, only while its lease
-- still owns the lock (the election is a Fair mutex of the same name; see
-- docs/PROTOCOL.md, Leader election).
-- KEYS[1]  the lock hash (o, f as for acquire.lua; v = the leader's value,
--          vf = the fence (term) it was published for, vn = how many values
--          were published under this key: v is the leader's only while o is
--          set and vf equals f)
-- ARGV[1]  owner token
-- ARGV[2]  the fence that token was granted (its term)
-- ARGV[3]  the value
-- ARGV[4]  the election's channel (PREFIX{NAME}:e, the key's slot); the
--          message is "FENCE SEQ VALUE", SEQ being the new vn
-- ARGV[5]  the publish command: SPUBLISH (also when absent) or PUBLISH (see
--          release.lua)
-- Returns  {1, seq}  published as the seq-th value of the key
--          {0}       not the owner with that fence: the leader was deposed
--                    (expired, handed over, deleted); nothing changed
-- Errors   DLOCK_ARG <what>  ARGV[5] is not a publish command
local key, token, fence = KEYS[1], ARGV[1], ARGV[2]
local pub = ARGV[5] or 'SPUBLISH'
if pub ~= 'SPUBLISH' and pub ~= 'PUBLISH' then return redis.error_reply('DLOCK_ARG publish command ' .. pub) end
local h = redis.call('HMGET', key, 'o', 'f', 'vn')
if h[1] ~= token or h[2] ~= fence then return {0} end
local n = string.format('%.0f', (tonumber(h[3]) or 0) + 1)
redis.call('HSET', key, 'v', ARGV[3], 'vf', fence, 'vn', n)
-- pcall: as in release.lua, a refused publish must not fail the script
-- after its write; observers see the value at their next read.
redis.pcall(pub, ARGV[4], fence .. ' ' .. n .. ' ' .. ARGV[3])
return {1, tonumber(n)}
