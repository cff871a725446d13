-- Attempt history (issue 19): one row per run of a job (every lease its worker received, the
-- rate-limited runs included), written by the status writer in its batches. Keyed by (job_id,
-- attempt) and deliberately without a foreign key to jobs, so the jobs table can be partitioned:
-- the retention pruner and `dispatcherctl jobs prune` delete a job's attempts with its row. Times
-- are epoch ms; outcome is NULL while the run goes on, else succeeded, failed, lease_expired,
-- cancelled or rate_limited.
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

-- A job's latest progress report (JSON: a fraction or a small object), written at most about once a
-- second per job (coalesced by the worker and by the status writer). NULL: none reported.
ALTER TABLE jobs ADD COLUMN progress TEXT;
