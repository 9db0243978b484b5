-- A fork's lineage in the read model: runs.forked_from is run_created's
-- forked_from without its copies ({run_id, step_id, seq}), steps.copied_from
-- a copied step's step_completed.copied_from ({run_id, seq, node_hash});
-- null for runs that are no fork and steps that ran.
ALTER TABLE runs ADD COLUMN forked_from jsonb;
ALTER TABLE steps ADD COLUMN copied_from jsonb;
