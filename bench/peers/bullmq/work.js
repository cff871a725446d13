// What a job's processor does after recording its start: the same kinds as bench/peers/_work.py.
// noop: nothing; redis: one pipelined round trip (INCR + SET) to the private Redis; io1ms: 1 ms of
// timer wait; cpu100us: about 100 µs of CPU, calibrated once per process. ioredis has no pool: one
// connection pipelines every processor's commands, which is how BullMQ users share a client.
'use strict';

const KINDS = ['noop', 'redis', 'io1ms', 'cpu100us'];
const COUNT_KEY = 'bench:work:count';

function kind() {
  const chosen = process.env.BENCH_WORK || 'noop';
  if (!KINDS.includes(chosen)) throw new Error(`BENCH_WORK=${chosen}: choose from ${KINDS.join(', ')}`);
  return chosen;
}

// The concurrency the driver chose, else the pinned one for this kind of work.
function concurrency(pinned) {
  return process.env.BENCH_CONCURRENCY ? Number(process.env.BENCH_CONCURRENCY) : pinned[kind()];
}

// Every value stays a small integer, so each round costs the same however many there are (a product
// past 2^31 turns into floating point), and the result goes to `sink`, so the JIT cannot drop the loop.
let sink = 0;
function spin(rounds) {
  let total = 0;
  for (let i = 0; i < rounds; i++) total = (total * 31 + i) % 65521;
  sink ^= total;
}

// Rounds of spin() that take `seconds`: the fastest of several timings (a timing that shared the core
// with another process only ever comes out slower), after a warm-up that lets the JIT compile it.
function calibrate(seconds) {
  const probe = 200000;
  for (let i = 0; i < 20; i++) spin(probe);
  let best = Infinity;
  for (let i = 0; i < 15; i++) {
    const t0 = performance.now();
    spin(probe);
    best = Math.min(best, (performance.now() - t0) / 1000);
  }
  return Math.max(1, Math.round((probe * seconds) / best));
}

// The work as an async function of the job's number, or null for no-op jobs.
function makeWork() {
  const chosen = kind();
  if (chosen === 'noop') return null;
  if (chosen === 'io1ms') return () => new Promise((resolve) => setTimeout(resolve, 1));
  if (chosen === 'cpu100us') {
    const rounds = calibrate(0.0001);
    return async () => { spin(rounds); };
  }
  const Redis = require('ioredis');
  const client = new Redis(process.env.BENCH_REDIS_URL);
  return async (seq) => {
    await client.pipeline().incr(COUNT_KEY).set(`bench:work:${seq}`, seq).exec();
  };
}

module.exports = { KINDS, COUNT_KEY, kind, concurrency, makeWork };
