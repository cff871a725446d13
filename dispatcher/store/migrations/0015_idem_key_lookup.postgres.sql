-- The job search finds a job by its idempotency key alone (issue 19). Since 0014 the keys live in
-- job_idem_keys, whose primary key leads with the type: this index serves a key without its type.
CREATE INDEX job_idem_keys_key ON job_idem_keys (idem_key);
