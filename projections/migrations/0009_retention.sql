-- PAL_RETENTION: a finished run whose journal retention removed keeps its
-- runs, steps and side_effect_receipts rows; journal_removed_at says when
-- the journal went (its journal_events rows go with it). The partial index
-- is what retention reads: the finished runs that still have a journal,
-- oldest end first, so a pass never reads the runs already removed.
ALTER TABLE runs ADD COLUMN journal_removed_at timestamptz;
CREATE INDEX runs_retention ON runs (ended_at) WHERE ended_at IS NOT NULL AND journal_removed_at IS NULL;
