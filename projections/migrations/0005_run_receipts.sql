-- Signed run receipts (package receipt), projected from the KV bucket
-- PAL_RECEIPTS, which is the truth: one row per ended run. Not derived from
-- the journal, so a projection rebuild leaves this table as it is; no
-- foreign key to runs for the same reason.
CREATE TABLE run_receipts (
    run_id              text PRIMARY KEY,
    workflow            text,
    status              text        NOT NULL,
    terminal_kind       text        NOT NULL,
    first_seq           bigint      NOT NULL,
    last_seq            bigint      NOT NULL,
    events              integer     NOT NULL,
    journal_digest      text        NOT NULL,
    terminal_event_hash text        NOT NULL,
    input_tokens        bigint      NOT NULL,
    output_tokens       bigint      NOT NULL,
    cost_usd            numeric     NOT NULL,
    key_id              text        NOT NULL,
    signed_at           timestamptz NOT NULL,
    signature           text        NOT NULL,
    receipt             jsonb       NOT NULL
);
CREATE INDEX run_receipts_key_id_idx ON run_receipts (key_id);
