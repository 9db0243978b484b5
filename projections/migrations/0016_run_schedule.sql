-- Schedules (PAL_SCHEDULES): runs.schedule and runs.tick are run_created's
-- schedule and tick (NULL for a run no schedule started). A listing by
-- schedule (GET /v1/runs?schedule=, pal run list --schedule) reads the
-- partial b-tree in the listing's order (created_at, run_id), so a page
-- stops at its limit.
ALTER TABLE runs ADD COLUMN schedule text;
ALTER TABLE runs ADD COLUMN tick timestamptz;
CREATE INDEX runs_schedule_created_idx ON runs (schedule, created_at, run_id) WHERE schedule IS NOT NULL;
