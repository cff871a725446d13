-- The dead-letter depth per queue (type, priority), kept by triggers with every change of a job's
-- status, so Stats and the health loop read one row per queue instead of counting the dead-letter
-- queue. A row whose n fell to 0 stays (one per queue that ever had a dead job).
CREATE TABLE dead_counts (
    type TEXT NOT NULL,
    priority SMALLINT NOT NULL,
    n BIGINT NOT NULL,
    PRIMARY KEY (type, priority)
);
CREATE TRIGGER jobs_dead_inserted AFTER INSERT ON jobs WHEN NEW.status = 'dead'
BEGIN
    INSERT INTO dead_counts (type, priority, n) VALUES (NEW.type, NEW.priority, 1)
        ON CONFLICT (type, priority) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER jobs_dead_entered AFTER UPDATE OF status ON jobs
    WHEN NEW.status = 'dead' AND OLD.status IS NOT 'dead'
BEGIN
    INSERT INTO dead_counts (type, priority, n) VALUES (NEW.type, NEW.priority, 1)
        ON CONFLICT (type, priority) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER jobs_dead_left AFTER UPDATE OF status ON jobs
    WHEN OLD.status = 'dead' AND NEW.status IS NOT 'dead'
BEGIN
    UPDATE dead_counts SET n = n - 1 WHERE type = OLD.type AND priority = OLD.priority;
END;
CREATE TRIGGER jobs_dead_deleted AFTER DELETE ON jobs WHEN OLD.status = 'dead'
BEGIN
    UPDATE dead_counts SET n = n - 1 WHERE type = OLD.type AND priority = OLD.priority;
END;
-- The jobs dead before this migration (the migration's transaction holds every other writer off).
INSERT INTO dead_counts (type, priority, n)
    SELECT type, priority, COUNT(*) FROM jobs WHERE status = 'dead' GROUP BY type, priority;
