-- Threads (GET /v1/runs?thread=, pal run list --thread): runs.thread is
-- run_created's thread (NULL for none), its filter a b-tree that ends in
-- the listing's order (created_at, run_id), so a page is read in order and
-- stops at its limit.
ALTER TABLE runs ADD COLUMN thread text;
CREATE INDEX runs_thread_created_idx ON runs (thread, created_at, run_id) WHERE thread IS NOT NULL;
