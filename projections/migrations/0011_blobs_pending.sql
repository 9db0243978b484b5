-- Retention releases a removed run's blobs after it purges the journal
-- (PAL_BLOB_REFS): blobs_pending holds the blobs the journal named until
-- they are released, so a release that failed is tried again by a later
-- pass (the journal that named them is gone). The partial index is what
-- that retry reads.
ALTER TABLE runs ADD COLUMN blobs_pending text[];
CREATE INDEX runs_blobs_pending ON runs (run_id) WHERE blobs_pending IS NOT NULL;
