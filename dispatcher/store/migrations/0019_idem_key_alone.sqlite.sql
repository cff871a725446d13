-- An idempotency key without its job type (the job search): jobs_idem_key leads with the type.
-- PostgreSQL has job_idem_keys_key (0015) for it.
CREATE INDEX IF NOT EXISTS jobs_idem_key_alone ON jobs (idem_key, id) WHERE idem_key IS NOT NULL;
