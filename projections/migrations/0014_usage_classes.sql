-- Honest usage: the input read from and written to the providers' prompt
-- caches (parts of input_tokens, priced at their own rates) and the output
-- spent thinking (part of output_tokens), per run and per step attempt;
-- the provider/model each LLM attempt called (a fallback list may call
-- several).
ALTER TABLE runs ADD COLUMN cache_read_tokens bigint NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN cache_write_tokens bigint NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN reasoning_tokens bigint NOT NULL DEFAULT 0;
ALTER TABLE steps ADD COLUMN cache_read_tokens bigint NOT NULL DEFAULT 0;
ALTER TABLE steps ADD COLUMN cache_write_tokens bigint NOT NULL DEFAULT 0;
ALTER TABLE steps ADD COLUMN reasoning_tokens bigint NOT NULL DEFAULT 0;
ALTER TABLE steps ADD COLUMN model text COLLATE "C";
