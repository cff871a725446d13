-- The last version of each schedule name whose row was removed (deleted, its future occurrences
-- cancelled). A schedule created again under that name continues after it: an occurrence's job id
-- is derived from (name, version, time), so a version used twice would give the new schedule the
-- ids of the old one's cancelled occurrences, and the new ones would never be inserted.
CREATE TABLE retired_schedule_versions (
    name TEXT PRIMARY KEY,
    version INTEGER NOT NULL
);
-- Names deleted before this table existed: their jobs still hold the versions they used.
INSERT INTO retired_schedule_versions (name, version)
SELECT schedule, MAX(schedule_version) FROM jobs
WHERE schedule IS NOT NULL AND schedule_version IS NOT NULL
GROUP BY schedule;
