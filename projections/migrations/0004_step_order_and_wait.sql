-- The read model orders steps by the journal (the seq of each attempt's
-- first event) and shows how long a step waited (approval, child run):
-- both come from the fold, like every other column.
ALTER TABLE steps ADD COLUMN first_seq bigint NOT NULL DEFAULT 0;
ALTER TABLE steps ADD COLUMN waiting_at timestamptz;
