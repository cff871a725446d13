-- The dead-letter depth per queue (type, priority), kept by triggers with every change of a job's
-- status, so Stats and the health loop read one row per queue instead of counting the dead-letter
-- queue. A row whose n fell to 0 stays (one per queue that ever had a dead job). The row triggers
-- fire only for a job entering or leaving the dead state (their WHEN); a purge's DELETE is counted
-- once per statement, from its transition table.
CREATE TABLE dead_counts (
    type TEXT NOT NULL,
    priority SMALLINT NOT NULL,
    n BIGINT NOT NULL,
    PRIMARY KEY (type, priority)
);
CREATE FUNCTION shardq_count_dead_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.status = 'dead' THEN
        UPDATE dead_counts SET n = n - 1 WHERE type = OLD.type AND priority = OLD.priority;
    END IF;
    IF NEW.status = 'dead' THEN
        INSERT INTO dead_counts (type, priority, n) VALUES (NEW.type, NEW.priority, 1)
            ON CONFLICT (type, priority) DO UPDATE SET n = dead_counts.n + 1;
    END IF;
    RETURN NULL;
END
$$;
CREATE FUNCTION shardq_count_dead_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE dead_counts SET n = dead_counts.n - gone.n
        FROM (SELECT type, priority, COUNT(*) AS n FROM deleted_jobs WHERE status = 'dead'
              GROUP BY type, priority) AS gone
        WHERE dead_counts.type = gone.type AND dead_counts.priority = gone.priority;
    RETURN NULL;
END
$$;
CREATE TRIGGER jobs_dead_inserted AFTER INSERT ON jobs
    FOR EACH ROW WHEN (NEW.status = 'dead') EXECUTE FUNCTION shardq_count_dead_row();
CREATE TRIGGER jobs_dead_updated AFTER UPDATE OF status ON jobs
    FOR EACH ROW WHEN ((OLD.status = 'dead') IS DISTINCT FROM (NEW.status = 'dead'))
    EXECUTE FUNCTION shardq_count_dead_row();
CREATE TRIGGER jobs_dead_deleted AFTER DELETE ON jobs REFERENCING OLD TABLE AS deleted_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION shardq_count_dead_deleted();
-- The jobs dead before this migration. After the triggers: creating them locked out every writer of
-- jobs until this transaction commits, so no job dies between this count and the triggers.
INSERT INTO dead_counts (type, priority, n)
    SELECT type, priority, COUNT(*) FROM jobs WHERE status = 'dead' GROUP BY type, priority;
