-- Idempotency keys belong to their job type: the same key in two types is two jobs, so a producer
-- of one type cannot register a key another type's producer will use (its enqueue would return a
-- job it may not read, and its own job would never exist). SQLite cannot drop the column's UNIQUE
-- constraint without rebuilding the table: the keys move to a new idem_key column, unique per type,
-- and the old column (renamed idem_key_unscoped) stays empty.
ALTER TABLE jobs RENAME COLUMN idem_key TO idem_key_unscoped;
ALTER TABLE jobs ADD COLUMN idem_key TEXT;
UPDATE jobs SET idem_key = idem_key_unscoped, idem_key_unscoped = NULL WHERE idem_key_unscoped IS NOT NULL;
CREATE UNIQUE INDEX jobs_idem_key ON jobs (type, idem_key) WHERE idem_key IS NOT NULL;
