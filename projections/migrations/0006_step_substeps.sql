-- A process step's child reports its own sub-steps (substep_started,
-- substep_completed); the read model shows them under the step, from
-- the fold like every other column.
ALTER TABLE steps ADD COLUMN substeps jsonb;
