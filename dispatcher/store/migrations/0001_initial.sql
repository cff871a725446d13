-- One schema for PostgreSQL and SQLite. Times are Unix epoch milliseconds.
CREATE TABLE cluster_meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

-- Fencing epochs: every acquisition of a shard takes the next epoch from here, so
-- epochs keep increasing even when Redis loses everything.
CREATE TABLE shards (
    shard INTEGER PRIMARY KEY,
    epoch BIGINT NOT NULL,
    owner TEXT NOT NULL,
    updated_at BIGINT NOT NULL
);

CREATE TABLE jobs (
    id TEXT PRIMARY KEY,
    type TEXT NOT NULL,
    shard INTEGER NOT NULL,
    priority SMALLINT NOT NULL,
    payload BYTEA NOT NULL,
    status TEXT NOT NULL,
    run_at BIGINT NOT NULL,
    lease_until BIGINT,
    attempts INTEGER NOT NULL DEFAULT 0,
    failures INTEGER NOT NULL DEFAULT 0,
    expirations INTEGER NOT NULL DEFAULT 0,
    max_attempts INTEGER NOT NULL,
    lease_ttl_ms INTEGER NOT NULL,
    idem_key TEXT UNIQUE,
    last_error TEXT,
    dead_reason TEXT,
    result BYTEA,
    enqueued_at BIGINT NOT NULL,
    started_at BIGINT,
    finished_at BIGINT,
    updated_at BIGINT NOT NULL
);

-- What the reconciler reads: the non-terminal jobs of a shard.
CREATE INDEX jobs_active ON jobs (shard, id) WHERE status IN ('delayed', 'ready', 'leased');
-- The dead-letter queue, listed and filtered by type and reason.
CREATE INDEX jobs_dead ON jobs (type, dead_reason, id) WHERE status = 'dead';
