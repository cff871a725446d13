-- Searches without a job type (store/search.py), each served by one range per partition instead of
-- one per job type and partition (jobs_finished, jobs_dead, jobs_idem_key all lead with the type:
-- at 10M rows over 11 daily partitions and 40 types, 170-260 ms for a finished range and 84-102 ms
-- for a dead reason that way, growing with the days kept). Each is partial, written only by the
-- rows it holds, never by the hot path's changes of an active job. IF NOT EXISTS: a large
-- installation can build them first without blocking writes
-- (docs/operations.md#searching-jobs-and-acting-on-many).

-- A finished-time range lists jobs in the order they finished.
CREATE INDEX IF NOT EXISTS jobs_finished_at ON jobs (finished_at, id)
    WHERE status IN ('succeeded', 'cancelled', 'dead');
-- A dead-letter reason, in id order.
CREATE INDEX IF NOT EXISTS jobs_dead_reason ON jobs (dead_reason, id) WHERE status = 'dead';
