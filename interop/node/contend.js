// node-redlock (4.2.0, over ioredis) contending with dlock's StringMutex
// (interop tests).
//
// Usage: node contend.js HOST PORT KEY COUNTER LOG SIDE N HOLD_MS PAUSE_MS
//
// Takes KEY N times with Redlock.lock (its lock script: SET PX if the key
// does not exist; unlock: compare-and-delete), and under it increments
// COUNTER read-modify-write (GET, sleep HOLD_MS, SET) and appends SIDE to
// the list LOG; sleeps PAUSE_MS between turns. Prints "ready" once
// connected and "done N" at the end.
'use strict';
const Redis = require('ioredis');
const Redlock = require('redlock');

const [host, port, key, counter, log, side] = process.argv.slice(2, 8);
const [n, hold, pause] = process.argv.slice(8, 11).map(Number);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function main() {
  const client = new Redis({ host, port: Number(port) });
  await client.ping();
  // retryCount -1: try until it gets the lock; retryDelay: how often.
  const redlock = new Redlock([client], { retryCount: -1, retryDelay: 10, retryJitter: 5 });
  console.log('ready');
  for (let i = 0; i < n; i++) {
    const lock = await redlock.lock(key, 10000);
    const v = Number((await client.get(counter)) || 0);
    await sleep(hold);
    await client.set(counter, v + 1);
    await client.rpush(log, side);
    await lock.unlock();
    await sleep(pause);
  }
  console.log('done', n);
  client.disconnect();
}

main().catch((e) => { console.error(e); process.exit(1); });
