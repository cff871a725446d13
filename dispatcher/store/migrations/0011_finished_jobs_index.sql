-- Retention (dispatcher/queue/pruner.py): the finished rows of each job type in the order they
-- finished, so the pruner finds the rows past their age, the oldest of a type and the types with
-- finished rows (a loose index scan) by walking this index, never the table. Partial: active jobs,
-- the hot path's rows, are not in it, and their status changes do not write it. The id makes the
-- order total (the pruner resumes after the last row it looked at).
CREATE INDEX jobs_finished ON jobs (type, status, finished_at, id)
    WHERE status IN ('succeeded', 'cancelled', 'dead');
