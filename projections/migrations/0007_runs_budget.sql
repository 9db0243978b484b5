-- A run's brakes: its effective budget (run_created's, plus every
-- budget_raised), the acting steps it started (what maxSteps limits) and
-- the brake it is paused on (budget or anomaly), if any.
ALTER TABLE runs ADD COLUMN budget jsonb;
ALTER TABLE runs ADD COLUMN steps_spent bigint NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN paused_on text;
