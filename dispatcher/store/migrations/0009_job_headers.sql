-- A job's headers (JobSpec.headers): a small map of strings, the W3C trace context above all, kept
-- with the row so that a retry, a reconcile after Redis lost its data and a dead-letter requeue all
-- deliver them again. JSON text of a flat object, NULL when the job has none (most jobs): the DB only
-- stores and returns it, so one portable TEXT column does for both backends.
ALTER TABLE jobs ADD COLUMN headers TEXT;
