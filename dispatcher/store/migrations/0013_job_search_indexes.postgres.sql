-- The job search (issue 19; dispatcher/store/search.py). jobs_type_id serves every search by job
-- type (exact, or patterns and scopes resolved to the known types by a loose scan of this index) in
-- id order, which is creation order. jobs_schedule_id does the same for a schedule's jobs (partial:
-- most jobs come from no schedule and never write it).
CREATE INDEX jobs_type_id ON jobs (type, id);
CREATE INDEX jobs_schedule_id ON jobs (schedule, id) WHERE schedule IS NOT NULL;

-- A payload as JSON when it is a JSON text (UTF-8), NULL otherwise: payloads are any bytes, and a
-- search by payload field must neither fail on one that is not JSON nor match it. IMMUTABLE, so an
-- operator can index a field: CREATE INDEX ON jobs ((shardq_payload_json(payload) #> '{customer_id}'))
-- (docs/operations.md). Only a payload that starts like an object is parsed. PARALLEL UNSAFE: its
-- exception block (a subtransaction) cannot run in a parallel worker.
CREATE FUNCTION shardq_payload_json(payload bytea) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL UNSAFE AS $$
BEGIN
    IF length(payload) = 0 OR get_byte(payload, 0) NOT IN (123, 32, 9, 10, 13) THEN
        RETURN NULL;
    END IF;
    RETURN convert_from(payload, 'UTF8')::jsonb;
EXCEPTION WHEN OTHERS THEN
    RETURN NULL;
END
$$;
