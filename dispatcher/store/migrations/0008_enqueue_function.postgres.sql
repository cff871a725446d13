-- Transactional enqueue (PostgreSQL only): a producer inserts jobs in its own transaction by calling
-- shardq_enqueue_v1 / shardq_enqueue_many_v1, the public and versioned contract (docs/operations.md
-- lists the grants a producer needs). The rows are made as the dispatcher's enqueue makes them: the
-- same id format, shard (CRC-32 of the type modulo the cluster's shard count), status, defaults and
-- validation messages (dispatcher/queue/validation.py). Each new job also gets a row in jobs_to_push,
-- and its shard is announced by pg_notify, which PostgreSQL delivers only when the transaction
-- commits: the owner of the shard then pushes the job to Redis and drops its jobs_to_push row
-- (dispatcher/queue/sql_enqueues.py). A rolled-back transaction leaves neither row nor notification.
-- A later change of the contract is a new function (shardq_enqueue_v2), never a change of these.

-- Jobs committed by the SQL functions that no dispatcher has pushed to Redis yet.
CREATE TABLE jobs_to_push (
    id TEXT PRIMARY KEY,
    shard INTEGER NOT NULL
);
CREATE INDEX jobs_to_push_shard ON jobs_to_push (shard, id);

-- The IEEE CRC-32 (zlib.crc32) of some bytes, as shardmap.shard_for hashes a job type: a table per
-- byte. PostgreSQL 15 has no crc32() of its own.
CREATE FUNCTION shardq_crc32(data bytea) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    crc_table CONSTANT bigint[] := '{0,1996959894,3993919788,2567524794,124634137,1886057615,3915621685,2657392035,249268274,2044508324,3772115230,2547177864,162941995,2125561021,3887607047,2428444049,498536548,1789927666,4089016648,2227061214,450548861,1843258603,4107580753,2211677639,325883990,1684777152,4251122042,2321926636,335633487,1661365465,4195302755,2366115317,997073096,1281953886,3579855332,2724688242,1006888145,1258607687,3524101629,2768942443,901097722,1119000684,3686517206,2898065728,853044451,1172266101,3705015759,2882616665,651767980,1373503546,3369554304,3218104598,565507253,1454621731,3485111705,3099436303,671266974,1594198024,3322730930,2970347812,795835527,1483230225,3244367275,3060149565,1994146192,31158534,2563907772,4023717930,1907459465,112637215,2680153253,3904427059,2013776290,251722036,2517215374,3775830040,2137656763,141376813,2439277719,3865271297,1802195444,476864866,2238001368,4066508878,1812370925,453092731,2181625025,4111451223,1706088902,314042704,2344532202,4240017532,1658658271,366619977,2362670323,4224994405,1303535960,984961486,2747007092,3569037538,1256170817,1037604311,2765210733,3554079995,1131014506,879679996,2909243462,3663771856,1141124467,855842277,2852801631,3708648649,1342533948,654459306,3188396048,3373015174,1466479909,544179635,3110523913,3462522015,1591671054,702138776,2966460450,3352799412,1504918807,783551873,3082640443,3233442989,3988292384,2596254646,62317068,1957810842,3939845945,2647816111,81470997,1943803523,3814918930,2489596804,225274430,2053790376,3826175755,2466906013,167816743,2097651377,4027552580,2265490386,503444072,1762050814,4150417245,2154129355,426522225,1852507879,4275313526,2312317920,282753626,1742555852,4189708143,2394877945,397917763,1622183637,3604390888,2714866558,953729732,1340076626,3518719985,2797360999,1068828381,1219638859,3624741850,2936675148,906185462,1090812512,3747672003,2825379669,829329135,1181335161,3412177804,3160834842,628085408,1382605366,3423369109,3138078467,570562233,1426400815,3317316542,2998733608,733239954,1555261956,3268935591,3050360625,752459403,1541320221,2607071920,3965973030,1969922972,40735498,2617837225,3943577151,1913087877,83908371,2512341634,3803740692,2075208622,213261112,2463272603,3855990285,2094854071,198958881,2262029012,4057260610,1759359992,534414190,2176718541,4139329115,1873836001,414664567,2282248934,4279200368,1711684554,285281116,2405801727,4167216745,1634467795,376229701,2685067896,3608007406,1308918612,956543938,2808555105,3495958263,1231636301,1047427035,2932959818,3654703836,1088359270,936918000,2847714899,3736837829,1202900863,817233897,3183342108,3401237130,1404277552,615818150,3134207493,3453421203,1423857449,601450431,3009837614,3294710456,1567103746,711928724,3020668471,3272380065,1510334235,755167117}';
    crc bigint := 4294967295;
BEGIN
    FOR i IN 0 .. length(data) - 1 LOOP
        crc := crc_table[((crc # get_byte(data, i)) & 255) + 1] # (crc >> 8);
    END LOOP;
    RETURN crc # 4294967295;
END
$$;

-- A job id as dispatcher/queue/ids.py makes one: 26 characters of Crockford base32, 48 bits of
-- milliseconds (10 characters, shardq_job_id_time) then 80 random bits (16 characters, one per random
-- byte's low 5 bits, shardq_job_id_random). The ids of one call share their time, as a batch's do.
CREATE FUNCTION shardq_job_id_time(at_ms bigint) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    alphabet CONSTANT text := '0123456789ABCDEFGHJKMNPQRSTVWXYZ';
    id text := '';
BEGIN
    FOR i IN REVERSE 9 .. 0 LOOP
        id := id || substr(alphabet, ((at_ms >> (5 * i)) & 31)::int + 1, 1);
    END LOOP;
    RETURN id;
END
$$;

-- The random bytes come from gen_random_uuid (a strong source built in since PostgreSQL 13): of a
-- version-4 UUID's 16 bytes, byte 6 carries the version in its high nibble and byte 8 the variant in
-- its top 2 bits, so the 16th character takes byte 6's low 4 bits and a fifth random bit of byte 8.
CREATE FUNCTION shardq_job_id_random() RETURNS text
LANGUAGE plpgsql VOLATILE PARALLEL SAFE AS $$
DECLARE
    alphabet CONSTANT text := '0123456789ABCDEFGHJKMNPQRSTVWXYZ';
    b CONSTANT bytea := uuid_send(gen_random_uuid());
BEGIN
    RETURN substr(alphabet, (get_byte(b, 0) & 31) + 1, 1) || substr(alphabet, (get_byte(b, 1) & 31) + 1, 1)
        || substr(alphabet, (get_byte(b, 2) & 31) + 1, 1) || substr(alphabet, (get_byte(b, 3) & 31) + 1, 1)
        || substr(alphabet, (get_byte(b, 4) & 31) + 1, 1) || substr(alphabet, (get_byte(b, 5) & 31) + 1, 1)
        || substr(alphabet, (get_byte(b, 7) & 31) + 1, 1) || substr(alphabet, (get_byte(b, 8) & 31) + 1, 1)
        || substr(alphabet, (get_byte(b, 9) & 31) + 1, 1) || substr(alphabet, (get_byte(b, 10) & 31) + 1, 1)
        || substr(alphabet, (get_byte(b, 11) & 31) + 1, 1) || substr(alphabet, (get_byte(b, 12) & 31) + 1, 1)
        || substr(alphabet, (get_byte(b, 13) & 31) + 1, 1) || substr(alphabet, (get_byte(b, 14) & 31) + 1, 1)
        || substr(alphabet, (get_byte(b, 15) & 31) + 1, 1)
        || substr(alphabet, ((get_byte(b, 6) & 15) | ((get_byte(b, 8) & 32) >> 1)) + 1, 1);
END
$$;

-- The checks and the insert behind both public functions. Every array has one entry per job, or is
-- NULL; a NULL entry means "not given" (the dispatcher's default). field_of names a job in errors as
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
    idempotency_keys text[]
) RETURNS text[]
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    -- The limits of dispatcher/queue/validation.py.
    max_key_length CONSTANT integer := 200;
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
        OR coalesce(cardinality(idempotency_keys), n) <> n THEN
        RAISE EXCEPTION 'jobs: every array must have one entry per job type (%)', n USING ERRCODE = '22023';
    END IF;
    FOR i IN 1 .. n LOOP
        field := CASE WHEN single THEN 'job' ELSE format('jobs[%s]', i - 1) END;
        t := coalesce(job_types[i], '');
        IF t = '' THEN
            RAISE EXCEPTION '%.type: must not be empty', field USING ERRCODE = '22023';
        END IF;
        -- TYPE_PATTERN; the value is quoted as Python's repr quotes a string without quotes in it.
        IF t !~ '^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,199}$' THEN
            RAISE EXCEPTION '%.type: % is not a job type: 1..200 characters of letters, digits and _.:/-, starting with a letter or digit',
                field, '''' || replace(replace(left(t, 60), '\', '\\'), '''', '\''') || ''''
                USING ERRCODE = '22023';
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
        -- str.isprintable's refusals that a text value can hold: C0 and C1 controls, the line and
        -- paragraph separators, spaces other than ' ', and the invisible format characters.
        IF k ~ '[\x01-\x1f\x7f-\xa0\xad\u1680\u2000-\u200f\u2028-\u202f\u205f-\u206f\u3000\ufeff]' THEN
            RAISE EXCEPTION '%.idempotency_key: must not contain control characters', field USING ERRCODE = '22023';
        END IF;
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
                          idem_key, enqueued_at, updated_at)
        SELECT v.id, v.type, v.shard, v.priority, coalesce(v.payload, ''::bytea), v.status, v.run_at,
               v.max_attempts, v.lease_ttl_ms, v.idem_key, now_ms, now_ms
          FROM unnest(ids, job_types, shards, prios, coalesce(payloads, array_fill(NULL::bytea, ARRAY[n])),
                      statuses, run_ats, attempts_col, ttls, keys)
               AS v(id, type, shard, priority, payload, status, run_at, max_attempts, lease_ttl_ms, idem_key)
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

-- Enqueue one job in the caller's transaction; returns its id (the existing job's id when a job of
-- the type holds the idempotency key). priority: 'high', 'default' or 'low'; run_at_ms (Unix ms) or
-- delay_ms; max_attempts and lease_ttl_ms default to the dispatcher's settings.
CREATE FUNCTION shardq_enqueue_v1(
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
                                ARRAY[idempotency_key]))[1]
$$;

-- Enqueue a batch in the caller's transaction: one array entry per job (the optional arrays may be
-- NULL, or hold NULL entries, for the defaults). Returns the ids in order.
CREATE FUNCTION shardq_enqueue_many_v1(
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
                               lease_ttl_ms, idempotency_keys)
$$;

-- They run with the rights of their owner (the dispatcher's role), so a producer needs EXECUTE on them
-- and nothing on the tables. Their names are looked up in the schema they were created in, then
-- pg_temp last, so that no object a caller creates can stand in for one of shardq's.
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION shardq_enqueue_v1(text, bytea, text, bigint, bigint, integer, integer, text) '
                   'SET search_path = %I, pg_catalog, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION shardq_enqueue_many_v1(text[], bytea[], text[], bigint[], bigint[], integer[], '
                   'integer[], text[]) SET search_path = %I, pg_catalog, pg_temp', current_schema());
END
$$;
-- Only the two versioned functions are the producers' to call (docs/operations.md: the grants).
REVOKE ALL ON FUNCTION shardq_enqueue_rows(boolean, text[], bytea[], text[], bigint[], bigint[], integer[], integer[], text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION shardq_enqueue_v1(text, bytea, text, bigint, bigint, integer, integer, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION shardq_enqueue_many_v1(text[], bytea[], text[], bigint[], bigint[], integer[], integer[], text[]) FROM PUBLIC;
