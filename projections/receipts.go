package projections

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/internal/retry"
	"github.com/palrun/pal/receipt"
)

// receiptRetry paces the receipt projection's retries (NATS or Postgres
// down).
var receiptRetry = retry.Policy{Initial: 100 * time.Millisecond, Max: 5 * time.Second, Jitter: 0.5}

// projectReceipts keeps run_receipts in step with the KV bucket
// PAL_RECEIPTS until ctx ends. A watch replays every stored receipt first,
// so a restart (or a row lost any other way) is filled in again; the
// upsert makes the replay a no-op for rows already there.
func (p *Projector) projectReceipts(ctx context.Context) {
	js := p.store.JetStream()
	_ = retry.Do(ctx, receiptRetry, func() error {
		kv, err := js.KeyValue(ctx, eventstore.ReceiptBucket)
		if err != nil {
			return err
		}
		w, err := kv.WatchAll(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = w.Stop() }()
		for {
			select {
			case <-ctx.Done():
				return retry.Permanent(ctx.Err())
			case e, ok := <-w.Updates():
				if !ok {
					return errors.New("receipt watch closed")
				}
				if e == nil || e.Operation() != jetstream.KeyValuePut {
					continue // nil: the replay of stored receipts is done
				}
				r, err := receipt.Decode(e.Value())
				if err != nil || r.RunID != e.Key() {
					p.log.Warn("skipping a stored receipt that does not decode", "key", e.Key(), "err", err)
					continue
				}
				err = retry.Do(ctx, receiptRetry, func() error { return p.putReceipt(ctx, r, e.Value()) })
				if err != nil {
					return retry.Permanent(err)
				}
			}
		}
	}, retry.OnRetry(func(err error, _ int, wait time.Duration) {
		p.log.Warn("receipt projection failed; retrying", "err", err, "wait", wait)
	}))
}

func (p *Projector) putReceipt(ctx context.Context, r *receipt.Receipt, raw []byte) error {
	_, err := p.pool.Exec(ctx, `INSERT INTO run_receipts (run_id, workflow, status, terminal_kind, first_seq, last_seq,
		events, journal_digest, terminal_event_hash, input_tokens, output_tokens, cost_usd, key_id, signed_at, signature, receipt)
		VALUES ($1, NULLIF($2, ''), $3, $4, $5, $6, $7, $8, $9, $10, $11, $12::numeric, $13, $14, $15, $16)
		ON CONFLICT (run_id) DO NOTHING`,
		r.RunID, r.Workflow, r.Status, string(r.TerminalKind), int64(r.FirstSeq), int64(r.LastSeq), r.Events,
		r.JournalDigest, r.TerminalEventHash, r.InputTokens, r.OutputTokens, r.CostUSD, r.KeyID, r.SignedAt, r.Signature, raw)
	if err != nil {
		return fmt.Errorf("writing the receipt of run %s: %w", r.RunID, err)
	}
	return nil
}

// Unsigned lists ended runs without a row in run_receipts, oldest end
// first: the recovery sweep signs them (workers.UnsignedSource).
func (q *Reader) Unsigned(ctx context.Context, limit int) ([]string, error) {
	rows, err := q.pool.Query(ctx, `SELECT r.run_id FROM runs r
		WHERE r.status IN ('succeeded', 'failed', 'cancelled')
		  AND NOT EXISTS (SELECT 1 FROM run_receipts rr WHERE rr.run_id = r.run_id)
		  AND r.journal_removed_at IS NULL
		ORDER BY r.updated_at, r.run_id LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("listing unsigned runs: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("listing unsigned runs: %w", err)
	}
	return ids, nil
}
