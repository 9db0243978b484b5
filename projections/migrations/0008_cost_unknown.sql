-- A step on a model the price table does not know has cost_usd 0 that is
-- not a price: cost_unknown says so, on the step and on its run.
ALTER TABLE steps ADD COLUMN cost_unknown boolean NOT NULL DEFAULT false;
ALTER TABLE runs ADD COLUMN cost_unknown boolean NOT NULL DEFAULT false;
