-- The job search (issue 19; dispatcher/store/search.py). jobs_type_id serves every search by job
-- type (exact, or patterns and scopes resolved to the known types by a loose scan of this index) in
-- id order, which is creation order. jobs_schedule_id does the same for a schedule's jobs (partial:
-- most jobs come from no schedule and never write it).
CREATE INDEX jobs_type_id ON jobs (type, id);
CREATE INDEX jobs_schedule_id ON jobs (schedule, id) WHERE schedule IS NOT NULL;
