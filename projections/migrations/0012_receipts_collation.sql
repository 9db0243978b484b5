-- Identifier columns use the "C" collation (byte order, as in the stream);
-- run_receipts, added later than the others, had the database default.
ALTER TABLE run_receipts ALTER COLUMN run_id TYPE text COLLATE "C";
ALTER TABLE run_receipts ALTER COLUMN key_id TYPE text COLLATE "C";
