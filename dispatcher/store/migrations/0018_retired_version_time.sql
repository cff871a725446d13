-- When each schedule name's last version was retired (ms): the type sweep drops a retired version
-- once no job row carries its name, but not within an hour of the retirement (see
-- store/leftovers.py). Names retired before this migration count as retired long ago.
ALTER TABLE retired_schedule_versions ADD COLUMN retired_at BIGINT NOT NULL DEFAULT 0;
