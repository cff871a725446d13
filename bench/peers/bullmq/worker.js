// One BullMQ worker process: a processor that records each start and then does the chosen work
// (work.js), `concurrency` jobs at a time.
'use strict';
const { Worker } = require('bullmq');
const { Probe } = require('./probe');
const { concurrency, makeWork } = require('./work');
const { connection, QUEUE, CONCURRENCY } = require('./settings');

const probe = new Probe(process.env.BENCH_REDIS_URL);
const work = makeWork();
const processor = work
  ? async (job) => { probe.started(job.data.s, job.data.e, job.data.r); await work(job.data.s); }
  : async (job) => probe.started(job.data.s, job.data.e, job.data.r);
const worker = new Worker(QUEUE, processor, { connection: connection(), concurrency: concurrency(CONCURRENCY) });

async function stop() {
  await worker.close();
  await probe.close();
  process.exit(0);
}
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
