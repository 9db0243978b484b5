-- The design names the run's totals cost and tokens: offer those names too,
-- kept in step with cost_usd and total_tokens by Postgres itself.
ALTER TABLE runs ADD COLUMN cost double precision GENERATED ALWAYS AS (cost_usd) STORED;
ALTER TABLE runs ADD COLUMN tokens bigint GENERATED ALWAYS AS (total_tokens) STORED;
