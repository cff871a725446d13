-- Version 2 of the SQL enqueue functions (migration 0008 made version 1): shardq_enqueue_v2 and
-- shardq_enqueue_many_v2 take version 1's arguments and, last, a concurrency key (flow control,
-- migration 0007) and headers (migration 0009), both checked as the RPC checks them and kept in
-- the row, so the push of the owner of the shard carries them to Redis and every lease. Version 1
-- keeps its signatures and behaviour: it calls the same internal function with neither.

-- str.isprintable (dispatcher/queue/validation.py and flow.py refuse what it refuses) for a text
-- value, which never holds NUL: the characters it refuses are every assigned one of the categories
-- Cc, Cf, Zs (but ' '), Zl, Zp and Co, listed as Python 3.11's Unicode 14 database has them.
-- Python also refuses the code points its database leaves unassigned; which those are moves with
-- the Python version the dispatcher runs, and they are let through here.
CREATE FUNCTION shardq_is_printable(value text) RETURNS boolean
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT value !~ '[\x01-\x1f\x7f-\xa0\xad\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2\u1680\u180e\u2000-\u200f\u2028-\u202f\u205f-\u2064\u2066-\u206f\u3000\ue000-\uf8ff\ufeff\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U00013438\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f\U000f0000-\U000ffffd\U00100000-\U0010fffd]'
$$;

-- Python's repr of a string, for the messages that quote a value as the RPC's do with !r: single
-- quotes unless the value has one and no double quote, backslash escapes for the quote, the
-- backslash, \t \n \r and every character str.isprintable refuses (\xhh, \uhhhh, \Uhhhhhhhh).
CREATE FUNCTION shardq_py_repr(value text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    quote CONSTANT text := CASE WHEN strpos(value, '''') > 0 AND strpos(value, '"') = 0 THEN '"' ELSE '''' END;
    out text := quote;
    c text;
    cp integer;
BEGIN
    FOR i IN 1 .. length(value) LOOP
        c := substr(value, i, 1);
        cp := ascii(c);
        IF c = '\' OR c = quote THEN
            out := out || '\' || c;
        ELSIF cp = 9 THEN
            out := out || '\t';
        ELSIF cp = 10 THEN
            out := out || '\n';
        ELSIF cp = 13 THEN
            out := out || '\r';
        ELSIF shardq_is_printable(c) THEN
            out := out || c;
        ELSIF cp < 256 THEN
            out := out || '\x' || lpad(to_hex(cp), 2, '0');
        ELSIF cp < 65536 THEN
            out := out || '\u' || lpad(to_hex(cp), 4, '0');
        ELSE
            out := out || '\U' || lpad(to_hex(cp), 8, '0');
        END IF;
    END LOOP;
    RETURN out || quote;
END
$$;

-- A job's headers checked as validation.job_headers checks them (field: 'job.headers' or
-- 'jobs[i].headers'), returned as the row keeps them: JSON text of an object with sorted keys, as
-- json.dumps(..., separators=(",", ":"), ensure_ascii=False) writes it; NULL for none (NULL or {}).
-- A value that is not an object of strings is refused too (the RPC's map cannot hold one).
CREATE FUNCTION shardq_job_headers(headers jsonb, field text) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    -- The limits of dispatcher/queue/validation.py.
    max_headers CONSTANT integer := 16;
    max_value_length CONSTANT integer := 1024;
    max_bytes CONSTANT integer := 4096;
    n integer;
    size integer := 0;
    header record;
    v text;
BEGIN
    IF headers IS NULL OR headers = 'null'::jsonb THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(headers) <> 'object' THEN
        RAISE EXCEPTION '%: must be a JSON object of strings', field USING ERRCODE = '22023';
    END IF;
    n := (SELECT count(*) FROM jsonb_object_keys(headers));
    IF n = 0 THEN
        RETURN NULL;
    END IF;
    IF n > max_headers THEN
        RAISE EXCEPTION '%: % headers is over the limit of %', field, n, max_headers USING ERRCODE = '22023';
    END IF;
    FOR header IN SELECT key, value FROM jsonb_each(headers) LOOP
        -- HEADER_KEY_PATTERN
        IF header.key !~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$' THEN
            RAISE EXCEPTION '%: % is not a header name: 1..64 characters of letters, digits and _.-, starting with a letter or digit',
                field, shardq_py_repr(left(header.key, 60)) USING ERRCODE = '22023';
        END IF;
        IF jsonb_typeof(header.value) <> 'string' THEN
            RAISE EXCEPTION '%[%]: must be a string', field, shardq_py_repr(header.key) USING ERRCODE = '22023';
        END IF;
        v := header.value #>> '{}';
        IF length(v) > max_value_length THEN
            RAISE EXCEPTION '%[%]: % characters is over the limit of %',
                field, shardq_py_repr(header.key), length(v), max_value_length USING ERRCODE = '22023';
        END IF;
        IF NOT shardq_is_printable(v) THEN
            RAISE EXCEPTION '%[%]: must not contain control characters', field, shardq_py_repr(header.key)
                USING ERRCODE = '22023';
        END IF;
        size := size + length(header.key) + octet_length(convert_to(v, 'UTF8'));
    END LOOP;
    IF size > max_bytes THEN
        RAISE EXCEPTION '%: % bytes is over the limit of %', field, size, max_bytes USING ERRCODE = '22023';
    END IF;
    -- The names are ASCII: "C" order is Python's sorted order. to_json escapes as json.dumps does the
    -- characters a checked value can hold (the quote and the backslash).
    RETURN '{' || (SELECT string_agg(to_json(key)::text || ':' || to_json(value #>> '{}')::text, ','
                                     ORDER BY key COLLATE "C")
                     FROM jsonb_each(headers)) || '}';
END
$$;

-- The internal function of version 1 gains the two arguments: replaced, and version 1 calls the new
-- one (below) with NULLs for them.
DROP FUNCTION shardq_enqueue_rows(boolean, text[], bytea[], text[], bigint[], bigint[], integer[], integer[], text[]);

-- The checks and the insert behind the public functions of both versions. Every array has one entry
-- per job, or is NULL; a NULL entry means "not given" (the dispatcher's default). field_of names a job in errors as
-- the RPC does: 'job' for a single enqueue, 'jobs[i]' (from 0) for a batch. Returns the ids in order;
-- a job whose idempotency key exists in its type gets the existing job's id and creates nothing.
CREATE FUNCTION shardq_enqueue_rows(
    single boolean,
    job_types text[],
    payloads bytea[],
    priorities text[],
    run_at_ms bigint[],
    delay_ms bigint[],
    max_attempts integer[],
    lease_ttl_ms integer[],
    idempotency_keys text[],
    concurrency_keys text[],
    headers jsonb[]
) RETURNS text[]
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    -- The limits of dispatcher/queue/validation.py.
    max_key_length CONSTANT integer := 200;
    -- dispatcher/queue/flow.py
    max_concurrency_key_length CONSTANT integer := 128;
    max_attempts_limit CONSTANT integer := 1000;
    min_lease_ttl_ms CONSTANT integer := 100;
    max_lease_ttl_ms CONSTANT integer := 24 * 3600 * 1000;
    max_horizon_ms CONSTANT bigint := 100::bigint * 365 * 24 * 3600 * 1000;
    -- What the dispatchers recorded in cluster_meta at their start (Store.record_enqueue_settings).
    shard_count integer;
    max_payload_bytes integer;
    default_max_attempts integer;
    default_lease_ttl_ms integer;
    max_batch integer;
    n integer := coalesce(cardinality(job_types), 0);
    now_ms bigint := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    -- All the ids of a call share their millisecond, as a batch's do in new_job_ids.
    id_prefix text := shardq_job_id_time(now_ms);
    field text;
    t text;
    p text;
    k text;
    ck text;
    given_run_at bigint;
    given_delay bigint;
    given_attempts integer;
    given_ttl integer;
    shard_of jsonb := '{}';
    ids text[] := '{}';
    shards integer[] := '{}';
    prios smallint[] := '{}';
    statuses text[] := '{}';
    run_ats bigint[] := '{}';
    attempts_col integer[] := '{}';
    ttls integer[] := '{}';
    keys text[] := '{}';
    concurrency_col text[] := '{}';
    headers_col text[] := '{}';
    out_ids text[];
    missing integer;
    notify_shards integer[];
BEGIN
    SELECT max(value) FILTER (WHERE key = 'shard_count')::integer,
           max(value) FILTER (WHERE key = 'max_payload_bytes')::integer,
           max(value) FILTER (WHERE key = 'max_attempts')::integer,
           max(value) FILTER (WHERE key = 'lease_ttl_ms')::integer,
           max(value) FILTER (WHERE key = 'max_batch')::integer
      INTO shard_count, max_payload_bytes, default_max_attempts, default_lease_ttl_ms, max_batch
      FROM cluster_meta;
    IF shard_count IS NULL OR max_payload_bytes IS NULL THEN
        RAISE EXCEPTION 'shardq: no dispatcher has started on this database yet (the shard count and limits are recorded at its start)'
            USING ERRCODE = '55000';
    END IF;
    IF NOT single THEN
        IF n = 0 THEN
            RAISE EXCEPTION 'jobs: the batch is empty' USING ERRCODE = '22023';
        END IF;
        IF n > max_batch THEN
            RAISE EXCEPTION 'jobs: % jobs is over the batch limit of %', n, max_batch USING ERRCODE = '22023';
        END IF;
    END IF;
    IF coalesce(cardinality(payloads), n) <> n OR coalesce(cardinality(priorities), n) <> n
        OR coalesce(cardinality(run_at_ms), n) <> n OR coalesce(cardinality(delay_ms), n) <> n
        OR coalesce(cardinality(max_attempts), n) <> n OR coalesce(cardinality(lease_ttl_ms), n) <> n
        OR coalesce(cardinality(idempotency_keys), n) <> n OR coalesce(cardinality(concurrency_keys), n) <> n
        OR coalesce(cardinality(headers), n) <> n THEN
        RAISE EXCEPTION 'jobs: every array must have one entry per job type (%)', n USING ERRCODE = '22023';
    END IF;
    FOR i IN 1 .. n LOOP
        field := CASE WHEN single THEN 'job' ELSE format('jobs[%s]', i - 1) END;
        t := coalesce(job_types[i], '');
        IF t = '' THEN
            RAISE EXCEPTION '%.type: must not be empty', field USING ERRCODE = '22023';
        END IF;
        -- TYPE_PATTERN
        IF t !~ '^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,199}$' THEN
            RAISE EXCEPTION '%.type: % is not a job type: 1..200 characters of letters, digits and _.:/-, starting with a letter or digit',
                field, shardq_py_repr(left(t, 60)) USING ERRCODE = '22023';
        END IF;
        IF length(coalesce(payloads[i], ''::bytea)) > max_payload_bytes THEN
            RAISE EXCEPTION '%.payload: % bytes is over the limit of %', field, length(payloads[i]), max_payload_bytes
                USING ERRCODE = '22023';
        END IF;
        p := coalesce(priorities[i], 'default');
        IF p NOT IN ('high', 'default', 'low') THEN
            RAISE EXCEPTION '%.priority: unknown priority %', field, quote_literal(p) USING ERRCODE = '22023';
        END IF;
        given_run_at := run_at_ms[i];
        given_delay := delay_ms[i];
        IF given_run_at IS NOT NULL AND given_delay IS NOT NULL THEN
            RAISE EXCEPTION '%: give run_at or delay, not both', field USING ERRCODE = '22023';
        END IF;
        IF given_delay IS NOT NULL THEN
            IF given_delay < 0 THEN
                RAISE EXCEPTION '%.delay_ms: must not be negative', field USING ERRCODE = '22023';
            END IF;
            IF given_delay > max_horizon_ms THEN
                RAISE EXCEPTION '%.delay_ms: more than a century', field USING ERRCODE = '22023';
            END IF;
            given_run_at := now_ms + given_delay;
        ELSIF given_run_at IS NOT NULL THEN
            IF given_run_at <= 0 THEN
                RAISE EXCEPTION '%.run_at_ms: must be a positive Unix time in milliseconds', field USING ERRCODE = '22023';
            END IF;
            IF given_run_at > now_ms + max_horizon_ms THEN
                RAISE EXCEPTION '%.run_at_ms: more than a century ahead', field USING ERRCODE = '22023';
            END IF;
        ELSE
            given_run_at := now_ms;
        END IF;
        given_attempts := coalesce(max_attempts[i], default_max_attempts);
        IF max_attempts[i] IS NOT NULL AND NOT given_attempts BETWEEN 1 AND max_attempts_limit THEN
            RAISE EXCEPTION '%.max_attempts: must be in 1..%', field, max_attempts_limit USING ERRCODE = '22023';
        END IF;
        given_ttl := coalesce(lease_ttl_ms[i], default_lease_ttl_ms);
        IF lease_ttl_ms[i] IS NOT NULL AND NOT given_ttl BETWEEN min_lease_ttl_ms AND max_lease_ttl_ms THEN
            RAISE EXCEPTION '%.lease_ttl_ms: must be in %..%', field, min_lease_ttl_ms, max_lease_ttl_ms
                USING ERRCODE = '22023';
        END IF;
        k := nullif(idempotency_keys[i], '');
        IF length(k) > max_key_length THEN
            RAISE EXCEPTION '%.idempotency_key: longer than % characters', field, max_key_length USING ERRCODE = '22023';
        END IF;
        IF NOT shardq_is_printable(k) THEN
            RAISE EXCEPTION '%.idempotency_key: must not contain control characters', field USING ERRCODE = '22023';
        END IF;
        ck := nullif(concurrency_keys[i], '');
        IF length(ck) > max_concurrency_key_length THEN
            RAISE EXCEPTION '%.concurrency_key: longer than % characters', field, max_concurrency_key_length
                USING ERRCODE = '22023';
        END IF;
        IF NOT shardq_is_printable(ck) THEN
            RAISE EXCEPTION '%.concurrency_key: must not contain control characters', field USING ERRCODE = '22023';
        END IF;
        headers_col := headers_col || shardq_job_headers(headers[i], field || '.headers');
        concurrency_col := concurrency_col || ck;
        IF NOT shard_of ? t THEN
            shard_of := shard_of || jsonb_build_object(t, shardq_crc32(convert_to(t, 'UTF8')) % shard_count);
        END IF;
        ids := ids || (id_prefix || shardq_job_id_random());
        shards := shards || (shard_of ->> t)::integer;
        prios := prios || (CASE p WHEN 'high' THEN 0 WHEN 'default' THEN 1 ELSE 2 END)::smallint;
        statuses := statuses || (CASE WHEN given_run_at > now_ms THEN 'delayed' ELSE 'ready' END);
        run_ats := run_ats || given_run_at;
        attempts_col := attempts_col || given_attempts;
        ttls := ttls || given_ttl;
        keys := keys || k;
    END LOOP;

    WITH inserted AS (
        INSERT INTO jobs (id, type, shard, priority, payload, status, run_at, max_attempts, lease_ttl_ms,
                          idem_key, concurrency_key, headers, enqueued_at, updated_at)
        SELECT v.id, v.type, v.shard, v.priority, coalesce(v.payload, ''::bytea), v.status, v.run_at,
               v.max_attempts, v.lease_ttl_ms, v.idem_key, v.concurrency_key, v.headers, now_ms, now_ms
          FROM unnest(ids, job_types, shards, prios, coalesce(payloads, array_fill(NULL::bytea, ARRAY[n])),
                      statuses, run_ats, attempts_col, ttls, keys, concurrency_col, headers_col)
               AS v(id, type, shard, priority, payload, status, run_at, max_attempts, lease_ttl_ms, idem_key,
                    concurrency_key, headers)
        ON CONFLICT DO NOTHING
        RETURNING jobs.id, jobs.shard
    ), queued AS (
        INSERT INTO jobs_to_push (id, shard) SELECT inserted.id, inserted.shard FROM inserted
        RETURNING jobs_to_push.shard
    )
    SELECT array_agg(DISTINCT queued.shard) INTO notify_shards FROM queued;

    -- A job with an idempotency key is the one that holds the key in its type: ours, an earlier one,
    -- or one a concurrent transaction committed while our insert waited for it (looked up one by one,
    -- through jobs_idem_key).
    out_ids := ids;
    IF cardinality(array_remove(keys, NULL)) > 0 THEN
        SELECT array_agg(held.id ORDER BY v.ord), count(*) FILTER (WHERE v.key IS NOT NULL AND held.id IS NULL)
          INTO out_ids, missing
          FROM unnest(ids, job_types, keys) WITH ORDINALITY AS v(id, type, key, ord)
          CROSS JOIN LATERAL (
              SELECT CASE WHEN v.key IS NULL THEN v.id
                          ELSE (SELECT j.id FROM jobs AS j WHERE j.type = v.type AND j.idem_key = v.key) END
          ) AS held(id);
        IF missing > 0 THEN
            -- The holder is invisible to this transaction's snapshot (REPEATABLE READ or SERIALIZABLE
            -- while another transaction committed it), or it was deleted meanwhile.
            RAISE EXCEPTION 'idempotency keys changed hands during the enqueue; try again' USING ERRCODE = '40001';
        END IF;
    END IF;

    PERFORM pg_notify('shardq_enqueued', s::text) FROM unnest(notify_shards) AS s;
    RETURN out_ids;
END
$$;

-- Version 1, as migration 0008 made it (signatures, defaults, results), on the new internal function.
-- CREATE OR REPLACE keeps the functions' owner and grants; their search_path is set again below.
CREATE OR REPLACE FUNCTION shardq_enqueue_v1(
    job_type text,
    payload bytea,
    priority text DEFAULT NULL,
    run_at_ms bigint DEFAULT NULL,
    delay_ms bigint DEFAULT NULL,
    max_attempts integer DEFAULT NULL,
    lease_ttl_ms integer DEFAULT NULL,
    idempotency_key text DEFAULT NULL
) RETURNS text
LANGUAGE sql VOLATILE SECURITY DEFINER AS $$
    SELECT (shardq_enqueue_rows(true, ARRAY[job_type], ARRAY[payload], ARRAY[priority], ARRAY[run_at_ms],
                                ARRAY[delay_ms], ARRAY[max_attempts], ARRAY[lease_ttl_ms],
                                ARRAY[idempotency_key], NULL, NULL))[1]
$$;

CREATE OR REPLACE FUNCTION shardq_enqueue_many_v1(
    job_types text[],
    payloads bytea[],
    priorities text[] DEFAULT NULL,
    run_at_ms bigint[] DEFAULT NULL,
    delay_ms bigint[] DEFAULT NULL,
    max_attempts integer[] DEFAULT NULL,
    lease_ttl_ms integer[] DEFAULT NULL,
    idempotency_keys text[] DEFAULT NULL
) RETURNS text[]
LANGUAGE sql VOLATILE SECURITY DEFINER AS $$
    SELECT shardq_enqueue_rows(false, job_types, payloads, priorities, run_at_ms, delay_ms, max_attempts,
                               lease_ttl_ms, idempotency_keys, NULL, NULL)
$$;

-- Enqueue one job in the caller's transaction; returns its id (the existing job's id when a job of
-- the type holds the idempotency key). Version 1's arguments, then concurrency_key (up to 128
-- characters; NULL or '' for none) and headers (a JSON object of up to 16 string values, 4 KiB in
-- all, such as the W3C traceparent/tracestate; NULL or {} for none).
CREATE FUNCTION shardq_enqueue_v2(
    job_type text,
    payload bytea,
    priority text DEFAULT NULL,
    run_at_ms bigint DEFAULT NULL,
    delay_ms bigint DEFAULT NULL,
    max_attempts integer DEFAULT NULL,
    lease_ttl_ms integer DEFAULT NULL,
    idempotency_key text DEFAULT NULL,
    concurrency_key text DEFAULT NULL,
    headers jsonb DEFAULT NULL
) RETURNS text
LANGUAGE sql VOLATILE SECURITY DEFINER AS $$
    SELECT (shardq_enqueue_rows(true, ARRAY[job_type], ARRAY[payload], ARRAY[priority], ARRAY[run_at_ms],
                                ARRAY[delay_ms], ARRAY[max_attempts], ARRAY[lease_ttl_ms],
                                ARRAY[idempotency_key], ARRAY[concurrency_key], ARRAY[headers]))[1]
$$;

-- Enqueue a batch in the caller's transaction: one array entry per job (the optional arrays may be
-- NULL, or hold NULL entries, for the defaults). Returns the ids in order.
CREATE FUNCTION shardq_enqueue_many_v2(
    job_types text[],
    payloads bytea[],
    priorities text[] DEFAULT NULL,
    run_at_ms bigint[] DEFAULT NULL,
    delay_ms bigint[] DEFAULT NULL,
    max_attempts integer[] DEFAULT NULL,
    lease_ttl_ms integer[] DEFAULT NULL,
    idempotency_keys text[] DEFAULT NULL,
    concurrency_keys text[] DEFAULT NULL,
    headers jsonb[] DEFAULT NULL
) RETURNS text[]
LANGUAGE sql VOLATILE SECURITY DEFINER AS $$
    SELECT shardq_enqueue_rows(false, job_types, payloads, priorities, run_at_ms, delay_ms, max_attempts,
                               lease_ttl_ms, idempotency_keys, concurrency_keys, headers)
$$;

-- As for version 1 (migration 0008): the owner's rights, names looked up in the schema they were
-- created in, then pg_temp last, and EXECUTE only for the roles it is granted to.
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION shardq_enqueue_v1(text, bytea, text, bigint, bigint, integer, integer, text) '
                   'SET search_path = %I, pg_catalog, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION shardq_enqueue_many_v1(text[], bytea[], text[], bigint[], bigint[], integer[], '
                   'integer[], text[]) SET search_path = %I, pg_catalog, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION shardq_enqueue_v2(text, bytea, text, bigint, bigint, integer, integer, text, '
                   'text, jsonb) SET search_path = %I, pg_catalog, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION shardq_enqueue_many_v2(text[], bytea[], text[], bigint[], bigint[], integer[], '
                   'integer[], text[], text[], jsonb[]) SET search_path = %I, pg_catalog, pg_temp', current_schema());
END
$$;
REVOKE ALL ON FUNCTION shardq_enqueue_rows(boolean, text[], bytea[], text[], bigint[], bigint[], integer[], integer[], text[], text[], jsonb[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION shardq_enqueue_v2(text, bytea, text, bigint, bigint, integer, integer, text, text, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION shardq_enqueue_many_v2(text[], bytea[], text[], bigint[], bigint[], integer[], integer[], text[], text[], jsonb[]) FROM PUBLIC;
