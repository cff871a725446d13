// Shared by the driver and the workers: the queue, its connection and the worker configuration.
'use strict';

const QUEUE = 'bench';
// Jobs at a time per worker process, per kind of work. No-op drain of 50,000, 2 processes: 50 ->
// 18.0-18.1K jobs/s, 100 -> 19.0K, 200 -> 21.5-22.4K, 400 -> 22.5K, 1,000 -> 18.9K.
const CONCURRENCY = { noop: 200, redis: 200, io1ms: 200, cpu100us: 200 };
// Completed jobs are removed at once (BullMQ keeps them all by default): the fastest usual setting.
const DEFAULT_JOB_OPTIONS = { removeOnComplete: true, removeOnFail: 1000 };

function connection() {
  const url = new URL(process.env.BENCH_REDIS_URL);
  return { host: url.hostname, port: Number(url.port), maxRetriesPerRequest: null };
}

module.exports = { QUEUE, CONCURRENCY, DEFAULT_JOB_OPTIONS, connection };
