-- Work queues: the queue whose workers drive each run (run_created.queue,
-- 'default' when it names none), for listings (GET /v1/runs?queue=) and
-- the queued runs of each queue (pal_runs_queued).
ALTER TABLE runs ADD COLUMN queue text COLLATE "C" NOT NULL DEFAULT 'default';
CREATE INDEX runs_queue_created_idx ON runs (queue, created_at, run_id);
