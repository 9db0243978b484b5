-- PAL projections: the read side of the journal in PAL_EVENTS (docs/architecture.md §13).
-- Every row here is derived from the stream and can be rebuilt from it
-- (pal projections rebuild); nothing else writes these tables.
-- Identifiers use the "C" collation: keys compare byte for byte, as in
-- the stream, whatever the database's locale, and their indexes stay fast.

CREATE TABLE journal_events (
    run_id     text COLLATE "C" NOT NULL,
    seq        bigint      NOT NULL,
    kind       text        NOT NULL,
    step_id    text COLLATE "C",
    attempt    integer,
    worker_id  text        NOT NULL,
    data       jsonb       NOT NULL,
    stream_seq bigint      NOT NULL,
    ts         timestamptz NOT NULL,
    PRIMARY KEY (run_id, seq)
);
COMMENT ON TABLE journal_events IS
    'PAL: every journal event, once per (run_id, seq), as it is in PAL_EVENTS (stream_seq)';

CREATE TABLE runs (
    run_id         text COLLATE "C" PRIMARY KEY,
    status         text NOT NULL
        CHECK (status IN ('queued', 'running', 'waiting', 'succeeded', 'failed', 'cancelled')),
    workflow_name  text,
    workflow       jsonb,
    workflow_hash  text,
    input          jsonb,
    output         jsonb,
    parent_run_id  text COLLATE "C",
    parent_step_id text COLLATE "C",
    depth          integer          NOT NULL DEFAULT 0,
    cost_usd       double precision NOT NULL DEFAULT 0,
    input_tokens   bigint           NOT NULL DEFAULT 0,
    output_tokens  bigint           NOT NULL DEFAULT 0,
    total_tokens   bigint           NOT NULL DEFAULT 0,
    error          text,
    error_code     text,
    failed_step    text,
    resumes        integer          NOT NULL DEFAULT 0,
    last_worker    text,
    created_at     timestamptz      NOT NULL,
    updated_at     timestamptz      NOT NULL,
    ended_at       timestamptz,
    last_seq       bigint           NOT NULL
);
CREATE INDEX runs_status_updated_at_idx ON runs (status, updated_at);
CREATE INDEX runs_parent_run_id_idx ON runs (parent_run_id) WHERE parent_run_id IS NOT NULL;
CREATE INDEX runs_created_at_idx ON runs (created_at, run_id);
COMMENT ON TABLE runs IS
    'PAL: one row per run, its state folded from the journal up to last_seq';

CREATE TABLE steps (
    run_id          text COLLATE "C" NOT NULL,
    step_id         text COLLATE "C" NOT NULL,
    attempt         integer NOT NULL,
    node_id         text,
    node_type       text,
    status          text    NOT NULL,
    input           jsonb,
    output          jsonb,
    error           text,
    error_class     text,
    idempotency_key text COLLATE "C",
    tries           integer          NOT NULL DEFAULT 0,
    input_tokens    bigint           NOT NULL DEFAULT 0,
    output_tokens   bigint           NOT NULL DEFAULT 0,
    cost_usd        double precision NOT NULL DEFAULT 0,
    delivery        text,
    started_at      timestamptz,
    ended_at        timestamptz,
    duration_ms     bigint           NOT NULL DEFAULT 0,
    last_seq        bigint  NOT NULL,
    PRIMARY KEY (run_id, step_id, attempt)
);
COMMENT ON TABLE steps IS
    'PAL: one row per step attempt (the waterfall), folded from the journal up to last_seq';

CREATE TABLE side_effect_receipts (
    run_id          text COLLATE "C" NOT NULL,
    step_id         text COLLATE "C" NOT NULL,
    attempt         integer NOT NULL,
    idempotency_key text COLLATE "C" UNIQUE,
    connector       text,
    target          text,
    status          text    NOT NULL CHECK (status IN ('claimed', 'delivered', 'unconfirmed')),
    http_status     integer,
    claimed_at      timestamptz,
    delivered_at    timestamptz,
    last_seq        bigint  NOT NULL,
    PRIMARY KEY (run_id, step_id, attempt)
);
COMMENT ON TABLE side_effect_receipts IS
    'PAL: one row per claimed external delivery (webhook, email) of a step attempt';

CREATE TABLE projection_checkpoints (
    projector  text COLLATE "C" PRIMARY KEY,
    stream_seq bigint      NOT NULL,
    updated_at timestamptz NOT NULL
);
COMMENT ON TABLE projection_checkpoints IS
    'PAL: the last PAL_EVENTS stream sequence each projector has written, moved in the same transaction as the rows';
