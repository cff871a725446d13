-- Recurring jobs. A schedule belongs to the shard of its job type; that shard's owner
-- materializes its occurrences into jobs (see dispatcher/schedules/scheduler.py).
CREATE TABLE schedules (
    name TEXT PRIMARY KEY,
    cron TEXT NOT NULL,
    timezone TEXT NOT NULL,
    type TEXT NOT NULL,
    shard INTEGER NOT NULL,
    payload BYTEA NOT NULL,
    priority SMALLINT NOT NULL,
    max_attempts INTEGER NOT NULL,
    lease_ttl_ms INTEGER NOT NULL,
    max_lag_ms BIGINT NOT NULL,
    catch_up TEXT NOT NULL,
    enabled BOOLEAN NOT NULL,
    -- Deleted, waiting for its owner to cancel its future occurrences; then the row goes.
    deleted BOOLEAN NOT NULL DEFAULT FALSE,
    -- Every change starts a new version at changed_at; the owner cancels the future
    -- occurrences of older versions at its next tick (cleanup_pending).
    version INTEGER NOT NULL,
    changed_at BIGINT NOT NULL,
    cleanup_pending BOOLEAN NOT NULL DEFAULT FALSE,
    -- Every occurrence at or before cursor_ms was materialized or skipped.
    cursor_ms BIGINT NOT NULL,
    last_occurrence_ms BIGINT,
    next_occurrence_ms BIGINT,
    materialized BIGINT NOT NULL DEFAULT 0,
    skipped BIGINT NOT NULL DEFAULT 0,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);
CREATE INDEX schedules_due ON schedules (shard, next_occurrence_ms);

-- The schedule (and its version) that materialized a job; NULL for a plain enqueue.
ALTER TABLE jobs ADD COLUMN schedule TEXT;
ALTER TABLE jobs ADD COLUMN schedule_version INTEGER;
CREATE INDEX jobs_schedule ON jobs (schedule, run_at);
