-- Labels and search (GET /v1/runs, pal run list): runs.labels is
-- run_created's labels ({} for none). Each filter of a listing has an
-- index: labels @> $1 the GIN index (jsonb_path_ops serves only @>, and is
-- smaller than the default opclass); status, workflow and error_code a
-- b-tree that ends in the listing's order (created_at, run_id), so a page
-- is read in order and stops at its limit; since/until the existing
-- runs_created_at_idx; the free text q (error ILIKE '%…%') a trigram
-- index when pg_trgm is available.
ALTER TABLE runs ADD COLUMN labels jsonb NOT NULL DEFAULT '{}';
CREATE INDEX runs_labels_idx ON runs USING gin (labels jsonb_path_ops);
CREATE INDEX runs_status_created_idx ON runs (status, created_at, run_id);
CREATE INDEX runs_workflow_created_idx ON runs (workflow_name, created_at, run_id);
CREATE INDEX runs_error_code_created_idx ON runs (error_code, created_at, run_id) WHERE error_code IS NOT NULL;

-- pg_trgm is in PostgreSQL's contrib and trusted (a database owner may
-- create it). Where it cannot be created (no contrib, no right), q still
-- works, scanning; create the extension and run pal projections rebuild
-- to get the index. The extension is never created in pal_rebuild, the
-- staging schema of a rebuild, which is dropped with CASCADE after the
-- swap and would take the extension (and the index) with it; its operator
-- class is named in the extension's own schema, as search_path may not
-- hold it.
DO $$
DECLARE
    trgm text;
BEGIN
    IF current_schema() <> 'pal_rebuild' AND NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_trgm') THEN
        BEGIN
            EXECUTE format('CREATE EXTENSION pg_trgm SCHEMA %I', current_schema());
        EXCEPTION WHEN OTHERS THEN
            RAISE NOTICE 'PAL: pg_trgm not created (%): GET /v1/runs?q= scans runs.error', SQLERRM;
        END;
    END IF;
    SELECT n.nspname INTO trgm FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'pg_trgm';
    IF trgm IS NOT NULL THEN
        EXECUTE format('CREATE INDEX runs_error_trgm_idx ON runs USING gin (error %I.gin_trgm_ops)', trgm);
    END IF;
END
$$;
