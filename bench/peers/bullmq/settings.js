// Shared by the driver and the workers: the queue, its connection and the worker configuration.
'use strict';

const QUEUE = 'bench';
// Jobs at a time per worker process, per kind of work. No-op drain of 50,000, 2 processes: 50 ->
// 18.0-18.1K jobs/s, 100 -> 19.0K, 200 -> 21.5-22.4K, 400 -> 22.5K, 1,000 -> 18.9K.
// `python -m bench sweep --system bullmq --work WORK` (drain of 20,000, best of 2-3 rounds in turns):
// redis 50 -> 13.4K, 100 -> 14.4K, 200 -> 16.1K, 500 -> 16.4K, 1,000 -> 14.7K; io1ms 200 -> 18.9K,
// 500 -> 18.7K, 1,000 -> 17.3K, 2,000 -> 15.8K; cpu100us 10 -> 8.0K, 50 -> 8.7K, 200 -> 8.8K, 500 -> 8.6K.
const CONCURRENCY = { noop: 200, redis: 500, io1ms: 200, cpu100us: 200 };
// Completed jobs are removed at once (BullMQ keeps them all by default): the fastest usual setting.
const DEFAULT_JOB_OPTIONS = { removeOnComplete: true, removeOnFail: 1000 };

function connection() {
  const url = new URL(process.env.BENCH_REDIS_URL);
  return { host: url.hostname, port: Number(url.port), maxRetriesPerRequest: null };
}

module.exports = { QUEUE, CONCURRENCY, DEFAULT_JOB_OPTIONS, connection };
