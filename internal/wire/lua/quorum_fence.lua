-- quorum_fence.lua: raise a held lock's counter to the fence of its quorum
-- grant, the largest that the granting masters handed out. Once a majority
-- holds it, every later quorum grant meets one of them and goes past it
-- (docs/PROTOCOL.md, "Fences under quorum").
-- KEYS[1]  the lock hash
-- ARGV[1]  owner token
-- ARGV[2]  the grant's fence
-- Returns  1 the counter is at least the fence now; 0 not the owner
local h = redis.call('HMGET', KEYS[1], 'o', 'f')
if h[1] ~= ARGV[1] then return 0 end
if (tonumber(h[2]) or 0) < tonumber(ARGV[2]) then redis.call('HSET', KEYS[1], 'f', ARGV[2]) end
return 1
