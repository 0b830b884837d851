-- list.lua: move one item from a seller's inventory into the market, as one
-- atomic step (the "lua" row: no WATCH, no lock).
--
-- KEYS[1] inventory:<seller>   KEYS[2] market:
-- ARGV[1] item id              ARGV[2] market member "<item>.<seller>"
-- ARGV[3] price
--
-- Returns 1 when listed, 0 when the item is not in the inventory.
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 0 then
  return 0
end
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[2])
redis.call('SREM', KEYS[1], ARGV[1])
return 1
