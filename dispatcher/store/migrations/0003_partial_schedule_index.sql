-- Most jobs come from no schedule: index only those that do. A status change is never a HOT update
-- (jobs_active's predicate reads status), so every update writes an entry into each full index.
DROP INDEX jobs_schedule;
CREATE INDEX jobs_schedule ON jobs (schedule, run_at) WHERE schedule IS NOT NULL;
