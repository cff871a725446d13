-- Most jobs have no idempotency key: the unique index holds only those that do (ON CONFLICT DO
-- NOTHING still skips a duplicate key). SQLite keeps its table constraint, which cannot be dropped
-- without rebuilding the table.
ALTER TABLE jobs DROP CONSTRAINT jobs_idem_key_key;
CREATE UNIQUE INDEX jobs_idem_key ON jobs (idem_key) WHERE idem_key IS NOT NULL;
