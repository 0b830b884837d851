-- purchase.lua: buy one market entry as one atomic step (the "lua" row).
-- The same reads and checks as the WATCH purchase, without the retries.
--
-- KEYS[1] market:              KEYS[2] users:<buyer>
-- KEYS[3] users:<seller>       KEYS[4] inventory:<buyer>
-- ARGV[1] market member        ARGV[2] item id
-- ARGV[3] the price the buyer saw
--
-- Returns 1 when bought, 0 when the entry is gone (or its price changed),
-- -1 when the buyer's funds are short.
local price = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not price or tonumber(price) ~= tonumber(ARGV[3]) then
  return 0
end
price = tonumber(price)
local funds = tonumber(redis.call('HGET', KEYS[2], 'funds'))
if not funds or funds < price then
  return -1
end
redis.call('HINCRBY', KEYS[3], 'funds', price)
redis.call('HINCRBY', KEYS[2], 'funds', -price)
redis.call('SADD', KEYS[4], ARGV[2])
redis.call('ZREM', KEYS[1], ARGV[1])
return 1
