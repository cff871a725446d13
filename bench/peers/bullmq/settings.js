// Shared by the driver and the workers: the queue, its connection and the worker configuration.
'use strict';

const QUEUE = 'bench';
const CONCURRENCY = 50;
// Completed jobs are removed at once (BullMQ keeps them all by default): the fastest usual setting.
const DEFAULT_JOB_OPTIONS = { removeOnComplete: true, removeOnFail: 1000 };

function connection() {
  const url = new URL(process.env.BENCH_REDIS_URL);
  return { host: url.hostname, port: Number(url.port), maxRetriesPerRequest: null };
}

module.exports = { QUEUE, CONCURRENCY, DEFAULT_JOB_OPTIONS, connection };
