// BullMQ's driver: the same actions, parameters and answers as bench/peers/_driver.py.
//   node driver.js ACTION 'PARAMS_JSON'   → prints "BENCH-RESULT {json}" last.
// One call per job is Queue.add, a batch is Queue.addBulk; workers are worker.js processes, doing the
// `work` the parameters name (work.js) at the `concurrency` they name or the pinned one (settings.js).
'use strict';
const { spawn } = require('child_process');
const path = require('path');
const Redis = require('ioredis');
const { Queue } = require('bullmq');
const { STARTS_KEY, nowSeconds } = require('./probe');
const { connection, QUEUE, CONCURRENCY, DEFAULT_JOB_OPTIONS } = require('./settings');
const { KINDS, COUNT_KEY } = require('./work');

const WARM_UP_JOBS = 4;
const MAX_IN_FLIGHT = 64;
const WORK_SETTLE_S = 30;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const sleepUntil = (t) => sleep(Math.max(0, (t - nowSeconds()) * 1000));

class Driver {
  constructor() {
    this.redis = new Redis(process.env.BENCH_REDIS_URL);
    this.recordsRead = 0;
    this.started = new Set();
    this.queue = new Queue(QUEUE, { connection: connection(), defaultJobOptions: DEFAULT_JOB_OPTIONS });
  }

  async close() {
    await this.queue.close();
    await this.redis.quit();
  }

  job(seq, tEnqueued, runAt) {
    const opts = runAt ? { delay: Math.max(0, Math.round((runAt - nowSeconds()) * 1000)) } : {};
    return { name: 'job', data: { s: seq, e: tEnqueued, r: runAt }, opts };
  }

  async enqueue(seq, tEnqueued, runAt) {
    const job = this.job(seq, tEnqueued, runAt);
    await this.queue.add(job.name, job.data, job.opts);
  }

  async enqueueBatch(jobs) {
    await this.queue.addBulk(jobs.map(([seq, t, r]) => this.job(seq, t, r)));
  }

  // Jobs started so far, each counted once (a job delivered twice is recorded twice).
  async starts() {
    const fresh = await this.redis.lrange(STARTS_KEY, this.recordsRead, -1);
    this.recordsRead += fresh.length;
    for (const record of fresh) this.started.add(record.split(' ', 1)[0]);
    return this.started.size;
  }

  async waitStarts(count, timeout) {
    const deadline = Date.now() + timeout * 1000;
    while ((await this.starts()) < count) {
      if (Date.now() > deadline) return false;
      await sleep(10);
    }
    return true;
  }

  // With redis work, wait (briefly) until every started job's round trip landed, so the workers are
  // not stopped under the last ones and the harness can count them.
  async settleWork() {
    if (process.env.BENCH_WORK !== 'redis') return;
    const deadline = Date.now() + WORK_SETTLE_S * 1000;
    while (Number((await this.redis.get(COUNT_KEY)) || 0) < (await this.starts()) && Date.now() < deadline) {
      await sleep(10);
    }
  }

  async enqueueBatches(firstSeq, jobs, batch, runAt = 0) {
    for (let start = firstSeq; start < firstSeq + jobs; start += batch) {
      const now = nowSeconds();
      const stop = Math.min(firstSeq + jobs, start + batch);
      const list = [];
      for (let seq = start; seq < stop; seq++) list.push([seq, now, runAt]);
      await this.enqueueBatch(list);
    }
  }

  startWorkers(processes) {
    const script = path.join(__dirname, 'worker.js');
    return Array.from({ length: processes }, () => spawn(process.execPath, [script], { stdio: ['ignore', 2, 2] }));
  }

  async stopWorkers(workers) {
    await Promise.all(workers.map((w) => new Promise((resolve) => {
      if (w.exitCode !== null) return resolve();
      const kill = setTimeout(() => w.kill('SIGKILL'), 10000);
      w.on('exit', () => { clearTimeout(kill); resolve(); });
      w.kill('SIGTERM');
    })));
  }

  async startWorkersWarm(processes) {
    const workers = this.startWorkers(processes);
    const base = await this.starts();
    for (let seq = -WARM_UP_JOBS; seq < 0; seq++) await this.enqueue(seq, nowSeconds(), 0);
    if (!(await this.waitStarts(base + WARM_UP_JOBS, 60))) {
      await this.stopWorkers(workers);
      throw new Error('the workers did not start the warm-up jobs');
    }
    return workers;
  }

  // -- actions --------------------------------------------------------------------------

  async versions() {
    const version = (name) => require(`${name}/package.json`).version;
    return {
      versions: { bullmq: version('bullmq'), ioredis: version('ioredis') },
      settings: { default_job_options: DEFAULT_JOB_OPTIONS, bulk: 'Queue.addBulk',
                  worker_concurrency: CONCURRENCY,
                  worker_concurrency_means: 'concurrency of each worker process' },
      node: process.version,
    };
  }

  async ingest(p) {
    const batch = p.mode === 'bulk' ? p.batch : 1;
    const t0 = performance.now();
    const stopAt = t0 + p.max_seconds * 1000;
    let done = 0;
    if (p.mode === 'pipelined') {
      // One job per call, up to MAX_IN_FLIGHT calls outstanding.
      const inFlight = new Set();
      let failed = 0;
      while (done < p.jobs && performance.now() < stopAt) {
        if (inFlight.size >= MAX_IN_FLIGHT) await Promise.race(inFlight);
        const call = this.enqueue(done, nowSeconds(), 0).catch(() => { failed += 1; })
          .finally(() => inFlight.delete(call));
        inFlight.add(call);
        done += 1;
      }
      await Promise.all(inFlight);
      return { jobs: done - failed, seconds: (performance.now() - t0) / 1000 };
    }
    while (done < p.jobs && performance.now() < stopAt) {
      const now = nowSeconds();
      if (batch === 1) {
        await this.enqueue(done, now, 0);
        done += 1;
      } else {
        const count = Math.min(batch, p.jobs - done);
        const list = [];
        for (let seq = done; seq < done + count; seq++) list.push([seq, now, 0]);
        await this.enqueueBatch(list);
        done += count;
      }
    }
    return { jobs: done, seconds: (performance.now() - t0) / 1000 };
  }

  async fill(p) {
    const t0 = performance.now();
    await this.enqueueBatches(p.first_seq || 0, p.jobs, p.batch);
    return { jobs: p.jobs, seconds: (performance.now() - t0) / 1000 };
  }

  async drain(p) {
    const t0 = performance.now();
    if (!p.prequeued) await this.enqueueBatches(0, p.jobs, p.batch);
    const prequeue = (performance.now() - t0) / 1000;
    const base = await this.starts();
    const workers = this.startWorkers(p.processes);
    try {
      let complete;
      let capped = false;
      if (p.max_seconds !== undefined) {
        // Stop max_seconds after the first start: a slow system is measured on the jobs it started.
        const begun = await this.waitStarts(base + 1, p.timeout);
        complete = begun && (await this.waitStarts(base + p.jobs, p.max_seconds));
        capped = begun && !complete;
      } else {
        complete = await this.waitStarts(base + p.jobs, p.timeout);
      }
      await this.settleWork();
      return { jobs: p.jobs, prequeue_seconds: prequeue, complete, capped };
    } finally {
      await this.stopWorkers(workers);
    }
  }

  async lease(p) {
    const base = await this.starts();
    const workers = this.startWorkers(p.processes);
    try {
      return { jobs: p.jobs, complete: await this.waitStarts(base + p.jobs, p.timeout) };
    } finally {
      await this.stopWorkers(workers);
    }
  }

  async latency(p) {
    const base = (await this.starts()) + WARM_UP_JOBS;
    const workers = await this.startWorkersWarm(p.processes);
    try {
      const steady = await this.steady(0, p.steady_rate, p.steady_seconds);
      const burst = await this.burst(steady.seq_end, p.burst_rate, p.burst_seconds, p.burst_batch);
      const accepted = steady.sent - steady.failed + burst.sent - burst.failed;
      const complete = await this.waitStarts(base + accepted, p.backlog_timeout);
      return { steady, burst, complete };
    } finally {
      await this.stopWorkers(workers);
    }
  }

  // One job per call on a fixed schedule, open loop (see InFlight).
  async steady(firstSeq, rate, seconds) {
    const count = Math.floor(rate * seconds);
    const flight = new InFlight();
    const t0 = nowSeconds() + 0.05;
    for (let i = 0; i < count; i++) {
      await sleepUntil(t0 + i / rate);
      await flight.issue(() => this.enqueue(firstSeq + i, nowSeconds(), 0), 1);
    }
    await flight.wait();
    return phase(firstSeq, count, flight.failed, t0, nowSeconds());
  }

  // Batches through addBulk at `rate` for `seconds`, open loop; a producer that still falls behind
  // sends fewer (the rate it reached is reported).
  async burst(firstSeq, rate, seconds, batch) {
    let count = Math.floor(rate * seconds);
    const flight = new InFlight();
    const t0 = nowSeconds() + 0.01;
    for (let start = 0; start < count; start += batch) {
      await sleepUntil(t0 + start / rate);
      if (nowSeconds() > t0 + seconds) {
        count = start;
        break;
      }
      const stop = Math.min(count, start + batch);
      await flight.issue(() => {
        const now = nowSeconds();
        const list = [];
        for (let i = start; i < stop; i++) list.push([firstSeq + i, now, 0]);
        return this.enqueueBatch(list);
      }, stop - start);
    }
    await flight.wait();
    return phase(firstSeq, count, flight.failed, t0, nowSeconds());
  }

  async delay(p) {
    const base = (await this.starts()) + WARM_UP_JOBS;
    const workers = await this.startWorkersWarm(p.processes);
    try {
      const due = nowSeconds() + p.instant_lead_s;
      await this.enqueueBatches(0, p.instant_jobs, 100, due);
      const instant = { ...phase(0, p.instant_jobs, 0, due, due), enqueued_before_due: nowSeconds() < due };
      const inTime = await this.waitStarts(base + instant.sent, p.timeout);
      let complete = true;
      const t0 = nowSeconds();
      for (let seq = instant.seq_end; seq < instant.seq_end + p.sequential_jobs; seq++) {
        const before = await this.starts();
        const now = nowSeconds();
        await this.enqueue(seq, now, now + p.sequential_delay_s);
        complete = (await this.waitStarts(before + 1, p.sequential_delay_s + 10)) && complete;
        await sleep(20);
      }
      const sequential = { ...phase(instant.seq_end, p.sequential_jobs, 0, t0, nowSeconds()), complete };
      await this.settleWork();
      return { instant, sequential, complete: inTime && complete };
    } finally {
      await this.stopWorkers(workers);
    }
  }
}

// Calls issued without waiting for the ones before them, at most MAX_IN_FLIGHT at a time, so a
// system's own latency does not lower the load it is measured under.
class InFlight {
  constructor() {
    this.pending = new Set();
    this.failed = 0;
  }

  async issue(call, jobs) {
    while (this.pending.size >= MAX_IN_FLIGHT) await Promise.race(this.pending);
    const promise = call().catch(() => { this.failed += jobs; }).finally(() => this.pending.delete(promise));
    this.pending.add(promise);
  }

  async wait() {
    await Promise.all(this.pending);
  }
}

function phase(firstSeq, count, failed, start, end) {
  return { seq_start: firstSeq, seq_end: firstSeq + count, sent: count, failed, start, end };
}

async function main() {
  const [action, raw] = process.argv.slice(2);
  const params = raw ? JSON.parse(raw) : {};
  const work = params.work || 'noop';
  if (!KINDS.includes(work)) throw new Error(`work ${work}: choose from ${KINDS.join(', ')}`);
  const concurrency = params.concurrency || CONCURRENCY[work];
  process.env.BENCH_WORK = work; // the workers this driver starts inherit both
  process.env.BENCH_CONCURRENCY = String(concurrency);
  const driver = new Driver();
  try {
    let result = await driver[action](params);
    if (action !== 'versions') result = { ...result, work, worker_concurrency: concurrency };
    process.stdout.write(`BENCH-RESULT ${JSON.stringify(result)}\n`);
  } finally {
    await driver.close();
  }
}

main().then(() => process.exit(0), (err) => { console.error(err); process.exit(1); });
