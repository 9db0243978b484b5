-- A delivery whose receiver answered with an error did not happen: say so
-- (failed) rather than leave it among the unknown outcomes (unconfirmed).
ALTER TABLE side_effect_receipts DROP CONSTRAINT side_effect_receipts_status_check;
ALTER TABLE side_effect_receipts ADD CONSTRAINT side_effect_receipts_status_check
    CHECK (status IN ('claimed', 'delivered', 'unconfirmed', 'failed'));
