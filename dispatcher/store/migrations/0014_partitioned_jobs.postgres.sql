-- The jobs table, partitioned by time (PostgreSQL only; dispatcher/store/partitions.py keeps the
-- partitions, docs/operations.md#partitions says how). A job id starts with 10 characters of its
-- creation time (dispatcher/queue/ids.py), so RANGE partitions of the id are time partitions whose
-- bounds are id prefixes, and the primary key (id) stays the partition key: unique across every
-- partition without a change. Retention then retires a whole partition once its finished rows are
-- past their periods (its few survivors copied into a small partition of the same range) instead of
-- deleting its rows one by one.
--
-- An existing table is not copied: it is renamed and attached as the partition jobs_legacy, covering
-- every id before the next UTC midnight (rows with later ids, which only a clock far ahead makes, go
-- to the default partition). Every index the table has (those of earlier migrations, those a later
-- migration numbered before this one added, an operator's own) is created again on the partitioned
-- table from its definition, and attaching the old table adopts its existing indexes instead of
-- building them, so the migration reads the table once (to check the bound) and rewrites nothing.
-- An empty table (a new install) is dropped instead: the dispatcher creates the partitions it needs.
-- Its triggers (the dead-letter counts of migration 0006) move to the partitioned table.
--
-- Idempotency keys: a unique index of a partitioned table must hold the partition key, so
-- (type, idem_key) cannot be unique across partitions by an index of jobs. The keys get a table of
-- their own, job_idem_keys, not partitioned, whose primary key is (type, idem_key): a trigger claims
-- a new job's key in it before the row is inserted (and skips the row, as ON CONFLICT DO NOTHING did,
-- when another job holds the key), and another frees the keys of deleted rows. Every path that
-- inserts jobs (the RPC's GroupCommit, the scheduler, shardq_enqueue_v1/v2) goes through them.
DO $$
DECLARE
    index_defs text[];
    trigger_defs text[];
    bad_unique text;
    boundary text;
    has_rows boolean;
    item record;
    def text;
BEGIN
    -- What the table has now: every index but the primary key and the idempotency key's, every
    -- trigger of ours.
    SELECT string_agg(i.indexrelid::regclass::text, ', ') INTO bad_unique
      FROM pg_index AS i
     WHERE i.indrelid = 'jobs'::regclass AND i.indisunique AND NOT i.indisprimary
       AND i.indexrelid <> to_regclass('jobs_idem_key');
    IF bad_unique IS NOT NULL THEN
        RAISE EXCEPTION 'jobs has unique indexes a partitioned table cannot have (they lack the id): %', bad_unique;
    END IF;
    SELECT coalesce(array_agg(pg_get_indexdef(i.indexrelid) ORDER BY c.relname), '{}') INTO index_defs
      FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
     WHERE i.indrelid = 'jobs'::regclass AND NOT i.indisunique;
    SELECT coalesce(array_agg(pg_get_triggerdef(t.oid) ORDER BY t.tgname), '{}') INTO trigger_defs
      FROM pg_trigger AS t WHERE t.tgrelid = 'jobs'::regclass AND NOT t.tgisinternal;
    FOR item IN SELECT tgname FROM pg_trigger WHERE tgrelid = 'jobs'::regclass AND NOT tgisinternal LOOP
        EXECUTE format('DROP TRIGGER %I ON jobs', item.tgname);
    END LOOP;
    DROP INDEX IF EXISTS jobs_idem_key;

    ALTER TABLE jobs RENAME TO jobs_legacy;
    FOR item IN SELECT c.relname FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
                 WHERE i.indrelid = 'jobs_legacy'::regclass LOOP
        EXECUTE format('ALTER INDEX %I RENAME TO %I', item.relname, left('legacy_' || item.relname, 63));
    END LOOP;

    -- Not its CHECK constraints: jobs_legacy_bound is the legacy partition's alone.
    EXECUTE 'CREATE TABLE jobs (LIKE jobs_legacy INCLUDING DEFAULTS INCLUDING STORAGE '
            'INCLUDING COMPRESSION) PARTITION BY RANGE (id)';
    ALTER TABLE jobs ADD PRIMARY KEY (id);
    FOREACH def IN ARRAY index_defs LOOP
        EXECUTE def;  -- each reads "CREATE INDEX name ON <schema>.jobs ...", the new table now
    END LOOP;
    CREATE TABLE jobs_default PARTITION OF jobs DEFAULT;

    SELECT EXISTS (SELECT 1 FROM jobs_legacy) INTO has_rows;
    -- A bound an operator checked beforehand, online (docs/operations.md#partitions): a validated
    -- CHECK (id < '<prefix>') named jobs_legacy_bound. Then nothing here reads the table.
    SELECT substring(pg_get_constraintdef(oid) FROM '''([0-9A-Z]{10})''') INTO boundary
      FROM pg_constraint WHERE conrelid = 'jobs_legacy'::regclass AND conname = 'jobs_legacy_bound'
       AND contype = 'c' AND convalidated;
    IF has_rows AND boundary IS NOT NULL THEN
        EXECUTE format('ALTER TABLE jobs ATTACH PARTITION jobs_legacy FOR VALUES FROM (MINVALUE) TO (%L)', boundary);
    ELSIF has_rows THEN
        ALTER TABLE jobs_legacy DROP CONSTRAINT IF EXISTS jobs_legacy_bound;
        boundary := shardq_job_id_time(
            (floor(extract(epoch FROM clock_timestamp()) / 86400)::bigint + 1) * 86400000);
        -- The legacy table's triggers were dropped above: moving a row counts nothing twice.
        EXECUTE format('WITH moved AS (DELETE FROM jobs_legacy WHERE id >= %L RETURNING *) '
                       'INSERT INTO jobs_default SELECT * FROM moved', boundary);
        -- The check proves the partition's bound, so the ATTACH does not read the table again; adding
        -- it reads the table once, while every writer of jobs waits for this migration.
        EXECUTE format('ALTER TABLE jobs_legacy ADD CONSTRAINT jobs_legacy_bound CHECK (id < %L)', boundary);
        EXECUTE format('ALTER TABLE jobs ATTACH PARTITION jobs_legacy FOR VALUES FROM (MINVALUE) TO (%L)', boundary);
    ELSE
        DROP TABLE jobs_legacy;
    END IF;

    FOREACH def IN ARRAY trigger_defs LOOP
        EXECUTE def;
    END LOOP;
END
$$;

-- One row per idempotency key held, unique within its job type across every partition.
CREATE TABLE job_idem_keys (
    type TEXT NOT NULL,
    idem_key TEXT NOT NULL,
    job_id TEXT NOT NULL,
    PRIMARY KEY (type, idem_key)
);
-- A retired partition frees its rows' keys by id range.
CREATE INDEX job_idem_keys_job ON job_idem_keys (job_id);
INSERT INTO job_idem_keys (type, idem_key, job_id)
    SELECT type, idem_key, id FROM jobs WHERE idem_key IS NOT NULL;

-- Before a job with a key is inserted: claim the key for it, or skip the row when another job holds
-- it (a concurrent claim waits for the other transaction, as a unique index's insert does). A key
-- whose job is gone (a retired partition's, until the keeper's sweep deletes it) is taken over: read
-- under a row lock, then the job looked for in a snapshot taken after it, so a holder that has just
-- committed is seen.
CREATE FUNCTION shardq_claim_idem_key() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    holder text;
BEGIN
    INSERT INTO job_idem_keys (type, idem_key, job_id) VALUES (NEW.type, NEW.idem_key, NEW.id)
        ON CONFLICT DO NOTHING;
    IF FOUND THEN
        RETURN NEW;
    END IF;
    SELECT job_id INTO holder FROM job_idem_keys WHERE type = NEW.type AND idem_key = NEW.idem_key FOR UPDATE;
    IF holder IS NULL THEN
        -- Freed since the insert looked: claim it now.
        INSERT INTO job_idem_keys (type, idem_key, job_id) VALUES (NEW.type, NEW.idem_key, NEW.id)
            ON CONFLICT DO NOTHING;
        IF FOUND THEN
            RETURN NEW;
        END IF;
        RETURN NULL;
    END IF;
    IF EXISTS (SELECT 1 FROM jobs WHERE id = holder) THEN
        RETURN NULL;
    END IF;
    UPDATE job_idem_keys SET job_id = NEW.id WHERE type = NEW.type AND idem_key = NEW.idem_key;
    RETURN NEW;
END
$$;
CREATE TRIGGER jobs_idem_key_claimed BEFORE INSERT ON jobs
    FOR EACH ROW WHEN (NEW.idem_key IS NOT NULL) EXECUTE FUNCTION shardq_claim_idem_key();

-- After a DELETE of jobs (retention's, a purge's): their keys are free again. A statement trigger
-- of the partitioned table, so moving rows between partitions (dispatcher/store/partitions.py) keeps
-- them.
CREATE FUNCTION shardq_free_idem_keys() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM job_idem_keys AS k USING deleted_jobs AS d
     WHERE d.idem_key IS NOT NULL AND k.type = d.type AND k.idem_key = d.idem_key AND k.job_id = d.id;
    RETURN NULL;
END
$$;
CREATE TRIGGER jobs_idem_keys_freed AFTER DELETE ON jobs REFERENCING OLD TABLE AS deleted_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION shardq_free_idem_keys();

-- While a partition is retired (dispatcher/store/partitions.py), a trigger of the partition notes
-- the ids of the rows that change in the table named by its argument, so that the copy of its
-- survivors can take them again before the swap.
CREATE FUNCTION shardq_note_retiring_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('INSERT INTO %I (id) VALUES ($1)', TG_ARGV[0])
        USING CASE WHEN TG_OP = 'DELETE' THEN OLD.id ELSE NEW.id END;
    RETURN NULL;
END
$$;

-- The SQL enqueue functions' internal function (migration 0010), the same but for its lookup of a
-- key's job, which reads job_idem_keys (one probe) instead of every partition's rows. Versions 1 and
-- 2 call it unchanged.
CREATE OR REPLACE FUNCTION shardq_enqueue_rows(
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
    -- through job_idem_keys).
    out_ids := ids;
    IF cardinality(array_remove(keys, NULL)) > 0 THEN
        SELECT array_agg(held.id ORDER BY v.ord), count(*) FILTER (WHERE v.key IS NOT NULL AND held.id IS NULL)
          INTO out_ids, missing
          FROM unnest(ids, job_types, keys) WITH ORDINALITY AS v(id, type, key, ord)
          CROSS JOIN LATERAL (
              SELECT CASE WHEN v.key IS NULL THEN v.id
                          ELSE (SELECT k.job_id FROM job_idem_keys AS k WHERE k.type = v.type AND k.idem_key = v.key) END
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
