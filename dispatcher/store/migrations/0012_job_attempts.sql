-- Attempt history (issue 19). A run of a job is a lease its worker received (rate-limited runs are
-- numbered too). Its latest run lives in its jobs row (worker below, started_at, finished_at and
-- status), so a run that succeeds costs no row here; a run that ends otherwise (failed,
-- lease_expired, cancelled, rate_limited) is kept here, written by the status writer in its
-- batches. Keyed by (job_id, attempt) and deliberately without a foreign key to jobs, so the jobs
-- table can be partitioned: the retention pruner, `dispatcherctl jobs prune` and the dead-letter
-- purge delete a job's attempts with its row. Times are epoch ms.
CREATE TABLE job_attempts (
    job_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    worker TEXT,
    started_at BIGINT,
    finished_at BIGINT,
    outcome TEXT,
    error TEXT,
    traceback TEXT,
    PRIMARY KEY (job_id, attempt)
);

-- The worker that holds (or held) the job's latest lease: its latest run's worker.
ALTER TABLE jobs ADD COLUMN worker TEXT;

-- A job's latest progress report (JSON: a fraction or a small object), written at most about once a
-- second per job (coalesced by the worker and by the status writer). NULL: none reported.
ALTER TABLE jobs ADD COLUMN progress TEXT;
