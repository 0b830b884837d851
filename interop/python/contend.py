"""redis-py's Lock contending with dlock's StringMutex (interop tests).

Usage: contend.py HOST PORT KEY COUNTER LOG SIDE N HOLD_MS PAUSE_MS

Takes KEY N times with redis.lock.Lock (SET NX PX, compare-and-delete),
and under it increments COUNTER read-modify-write (GET, sleep HOLD_MS,
SET) and appends SIDE to the list LOG; sleeps PAUSE_MS between turns.
Prints "ready" once connected and "done N" at the end.
"""
import sys
import time

import redis

host, port, key, counter, log, side = sys.argv[1:7]
n, hold, pause = int(sys.argv[7]), int(sys.argv[8]) / 1000, int(sys.argv[9]) / 1000

r = redis.Redis(host=host, port=int(port))
r.ping()
print("ready", flush=True)
for i in range(n):
    # sleep: how often a blocked acquire tries again (redis-py polls).
    lock = r.lock(key, timeout=10, sleep=0.01, blocking_timeout=30)
    if not lock.acquire():
        sys.exit("not acquired within 30s")
    v = int(r.get(counter) or 0)
    time.sleep(hold)
    r.set(counter, v + 1)
    r.rpush(log, side)
    lock.release()
    time.sleep(pause)
print("done", n, flush=True)
