-- Idempotency keys belong to their job type: the same key in two types is two jobs, so a producer
-- of one type cannot register a key another type's producer will use (its enqueue would return a
-- job it may not read, and its own job would never exist).
DROP INDEX jobs_idem_key;
CREATE UNIQUE INDEX jobs_idem_key ON jobs (type, idem_key) WHERE idem_key IS NOT NULL;
