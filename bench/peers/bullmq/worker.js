// One BullMQ worker process: a no-op processor that records each start, CONCURRENCY jobs at a time.
'use strict';
const { Worker } = require('bullmq');
const { Probe } = require('./probe');
const { connection, QUEUE, CONCURRENCY } = require('./settings');

const probe = new Probe(process.env.BENCH_REDIS_URL);
const worker = new Worker(QUEUE, async (job) => probe.started(job.data.s, job.data.e, job.data.r), {
  connection: connection(),
  concurrency: CONCURRENCY,
});

async function stop() {
  await worker.close();
  await probe.close();
  process.exit(0);
}
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
