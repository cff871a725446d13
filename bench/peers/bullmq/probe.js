// What a worker's processor calls when a job starts: the same records as bench/peers/_probe.py
// ("seq t_enqueued run_at t_started pid", wall-clock seconds), buffered and pushed every 5 ms.
'use strict';
const Redis = require('ioredis');

const STARTS_KEY = 'bench:starts';

function nowSeconds() {
  return (performance.timeOrigin + performance.now()) / 1000;
}

class Probe {
  constructor(url) {
    this.redis = new Redis(url);
    this.buffer = [];
    this.timer = setInterval(() => this.flush(), 5);
  }

  started(seq, tEnqueued, runAt) {
    this.buffer.push(`${seq} ${tEnqueued.toFixed(6)} ${runAt.toFixed(6)} ${nowSeconds().toFixed(6)} ${process.pid}`);
  }

  flush() {
    if (this.buffer.length) {
      const batch = this.buffer;
      this.buffer = [];
      this.redis.rpush(STARTS_KEY, ...batch);
    }
  }

  async close() {
    clearInterval(this.timer);
    this.flush();
    await this.redis.quit();
  }
}

module.exports = { Probe, STARTS_KEY, nowSeconds };
