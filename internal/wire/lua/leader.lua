-- leader.lua: read an election at once: its fields and the lock's remaining
-- lease (a plain reader needs only the HMGET; see docs/PROTOCOL.md, Leader
-- election). Writes nothing.
-- KEYS[1]  the lock hash
-- Returns  {o, f, vf, v, vn, k, pttl_ms}: the fields (false, a nil reply,
--          when absent; see wire.LeaderFields) and PTTL of the key (-2: no
--          key, -1: no expiry)
local r = redis.call('HMGET', KEYS[1], 'o', 'f', 'vf', 'v', 'vn', 'k')
r[7] = redis.call('PTTL', KEYS[1])
return r
