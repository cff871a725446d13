-- Flow control (issue 20). A job's concurrency key: its type's per-key limits and round robin go by
-- it (NULL: none). rate_limited: how often its handler raised RateLimited, retries that charged no
-- attempt. queue_settings: each job type's pause, limits and weights (dispatcher/queue/flow.py,
-- QueueSettings.to_json), mirrored into the Redis hash of the type's shard for the lease script. A
-- type without a row has the defaults: running, no limit.
ALTER TABLE jobs ADD COLUMN concurrency_key TEXT;
ALTER TABLE jobs ADD COLUMN rate_limited INTEGER NOT NULL DEFAULT 0;
CREATE TABLE queue_settings (
    job_type TEXT PRIMARY KEY,
    settings TEXT NOT NULL,
    updated_at BIGINT NOT NULL
);
