-- Workflows (issue 21): jobs that wait for other jobs. One schema for PostgreSQL and SQLite.
--
-- A job with dependencies is inserted with status 'waiting' and deps_remaining = its unfinished
-- dependencies; it is in no Redis set. The transaction that records a dependency's terminal status
-- resolves its edges (store/dependencies.py): each edge once (resolved_state goes from NULL to the
-- dependency's status under the edge's row lock), the dependent's count down by one under its row
-- lock, and the dependent that reaches zero moves to 'ready'/'delayed' (or 'cancelled' under the
-- 'fail' policy) in that same transaction.
ALTER TABLE jobs ADD COLUMN deps_remaining INTEGER NOT NULL DEFAULT 0;

CREATE TABLE job_dependencies (
    job_id TEXT NOT NULL,            -- the waiting job
    depends_on_id TEXT NOT NULL,     -- the job it waits for
    on_failure TEXT NOT NULL,        -- 'fail' or 'ignore'
    resolved_state TEXT,             -- NULL until the dependency finished: then its terminal status
    -- The dependency's result, copied when it resolved: the dependent reads it even after retention
    -- deleted the dependency's row.
    result BYTEA,
    PRIMARY KEY (job_id, depends_on_id)
);
-- From a finishing job to the jobs waiting for it.
CREATE INDEX job_dependencies_dependents ON job_dependencies (depends_on_id, job_id);
-- The waiting jobs of a shard (the reconciler's repair sweep, the waiting gauge).
CREATE INDEX jobs_waiting ON jobs (shard, id) WHERE status = 'waiting';
