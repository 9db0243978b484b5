package projections

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// MinRetention is the shortest PAL_RETENTION accepted: a journal must
// outlive the projector's lag, the receipt sweep and an operator's
// archive by a wide margin.
const MinRetention = time.Hour

// minRetention is MinRetention, lowered by tests (export_test.go).
var minRetention = MinRetention

// ParseRetention parses a PAL_RETENTION value: empty keeps journals
// forever (0); otherwise a Go duration (12h, 90m) or a whole number of
// days (30d), at least MinRetention.
func ParseRetention(v string) (time.Duration, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, nil
	}
	var d time.Duration
	if days, ok := strings.CutSuffix(v, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n <= 0 || n > 100*365 {
			return 0, fmt.Errorf("PAL_RETENTION=%q: want a whole number of days from 1 to 36500 (30d) or a Go duration (12h)", v)
		}
		d = time.Duration(n) * 24 * time.Hour
	} else {
		var err error
		if d, err = time.ParseDuration(v); err != nil {
			return 0, fmt.Errorf("PAL_RETENTION=%q: want a number of days (30d) or a Go duration (12h)", v)
		}
	}
	if d < minRetention {
		return 0, fmt.Errorf("PAL_RETENTION=%q: below the minimum %s (leave it unset to keep journals forever)", v, minRetention)
	}
	return d, nil
}

// retentionPage is how many expired runs one query returns;
// retentionPerPass bounds the runs one pass removes, so a first pass over
// a large backlog does not hold the projector's connection for long.
const (
	retentionPage    = 100
	retentionPerPass = 1000
)

// retentionInterval is how often the projector looks for expired runs:
// a tenth of the retention, between 100 ms (tests) and 5 minutes.
func retentionInterval(d time.Duration) time.Duration {
	return min(max(d/10, 100*time.Millisecond), 5*time.Minute)
}

// RemoveExpired removes the journals of runs that ended more than the
// projector's Retention ago, up to retentionPerPass of them, oldest end
// first, and returns how many it removed. For each run it checks the
// journal's last event is terminal (the journal is the truth, not the
// row), lists the PAL_BLOBS objects its events name, marks the run
// (runs.journal_removed_at, with the blobs in runs.blobs_pending) and
// drops its journal_events rows, purges its subject from PAL_EVENTS, and
// then releases its blobs (deleting those no kept run references,
// eventstore.Store.ReleaseBlobs); a pass first retries the releases that
// failed. The runs, steps and side_effect_receipts rows stay, and so
// does its PAL_RECEIPTS entry. With no Retention it removes nothing.
func (p *Projector) RemoveExpired(ctx context.Context) (int, error) {
	if p.cfg.Retention <= 0 {
		return 0, nil
	}
	if err := p.releasePending(ctx); err != nil {
		return 0, err
	}
	n := 0
	for n < retentionPerPass {
		cutoff := time.Now().Add(-p.cfg.Retention)
		rows, err := p.pool.Query(ctx, `SELECT run_id FROM runs
			WHERE ended_at IS NOT NULL AND journal_removed_at IS NULL AND ended_at < $1
			ORDER BY ended_at LIMIT $2`, cutoff, retentionPage)
		if err != nil {
			return n, fmt.Errorf("retention: listing expired runs: %w", err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return n, fmt.Errorf("retention: listing expired runs: %w", err)
		}
		removed := 0
		for _, id := range ids {
			ok, err := p.removeJournal(ctx, id)
			if err != nil {
				return n, err
			}
			if ok {
				removed++
				n++
			}
		}
		if len(ids) < retentionPage || removed == 0 {
			return n, nil
		}
	}
	return n, nil
}

// removeJournal removes one expired run's journal; false means it was
// left, because its journal goes on past its projected end (the row is
// behind; a later pass sees it again).
func (p *Projector) removeJournal(ctx context.Context, runID string) (bool, error) {
	last, head, err := p.store.LastEvent(ctx, runID)
	if err != nil {
		return false, fmt.Errorf("retention: %w", err)
	}
	if head.Seq > 0 && !last.Kind.Terminal() {
		p.log.Warn("retention: skipping a run whose journal has not ended", "run_id", runID, "last", last.Kind)
		return false, nil
	}
	// The stream's last message is never purged, so its last sequence is
	// always a message that exists: readers that replay up to it (the
	// projector catching up, a rebuild) would wait forever for a purged
	// one. Such a run goes in a later pass, once anything is appended.
	if head.Seq > 0 {
		tail, err := streamLastSeq(ctx, p.store.JetStream())
		if err != nil {
			return false, fmt.Errorf("retention: %w", err)
		}
		if head.StreamSeq >= tail {
			return false, nil
		}
	}
	// The blobs are released after the purge (a journal that stays must
	// keep every blob it names), from the list taken now and kept with
	// the mark (runs.blobs_pending), so a release that fails is tried
	// again by a later pass.
	sums, err := p.store.BlobsOf(ctx, runID)
	if err != nil {
		return false, fmt.Errorf("retention: %w", err)
	}
	// Mark first, under the batch lock: a rebuild that swaps after this
	// commit copies the run's rows over (it cannot replay them once the
	// journal is purged), one that swapped before is already live.
	if err := p.markRemoved(ctx, runID, sums); err != nil {
		return false, err
	}
	if err := p.store.PurgeJournal(ctx, runID); err != nil {
		// The journal is still there, so the run reads from it; unmark it
		// so a later pass tries again.
		if _, uerr := p.pool.Exec(context.WithoutCancel(ctx),
			"UPDATE runs SET journal_removed_at = NULL, blobs_pending = NULL WHERE run_id = $1", runID); uerr != nil {
			p.log.Warn("retention: unmarking a run whose purge failed", "run_id", runID, "err", uerr)
		}
		return false, fmt.Errorf("retention: %w", err)
	}
	blobs, err := p.releaseBlobs(ctx, runID, sums)
	if err != nil {
		// The journal is gone; its blobs stay pending for a later pass.
		p.log.Warn("retention: releasing a removed run's blobs", "run_id", runID, "err", err)
	}
	p.log.Debug("retention removed a finished run's journal", "run_id", runID, "blobs_deleted", blobs)
	return true, nil
}

// releaseBlobs releases a removed run's blobs (eventstore.Store.ReleaseBlobs)
// and clears its runs.blobs_pending.
func (p *Projector) releaseBlobs(ctx context.Context, runID string, sums []string) (int, error) {
	n, err := p.store.ReleaseBlobs(ctx, runID, sums)
	if err != nil {
		return n, err
	}
	if len(sums) > 0 {
		if _, err := p.pool.Exec(ctx, "UPDATE runs SET blobs_pending = NULL WHERE run_id = $1", runID); err != nil {
			return n, fmt.Errorf("retention: clearing the released blobs of run %s: %w", runID, err)
		}
	}
	return n, nil
}

// releasePending releases the blobs of removed runs whose release failed
// (runs.blobs_pending), up to retentionPage of them.
func (p *Projector) releasePending(ctx context.Context) error {
	rows, err := p.pool.Query(ctx, `SELECT run_id, blobs_pending FROM runs
		WHERE blobs_pending IS NOT NULL ORDER BY run_id LIMIT $1`, retentionPage)
	if err != nil {
		return fmt.Errorf("retention: listing blobs to release: %w", err)
	}
	type pending struct {
		RunID string
		Sums  []string
	}
	list, err := pgx.CollectRows(rows, pgx.RowToStructByPos[pending])
	if err != nil {
		return fmt.Errorf("retention: listing blobs to release: %w", err)
	}
	for _, r := range list {
		if _, err := p.releaseBlobs(ctx, r.RunID, r.Sums); err != nil {
			return err
		}
	}
	return nil
}

func (p *Projector) markRemoved(ctx context.Context, runID string, sums []string) error {
	return pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", lockBatch); err != nil {
			return err
		}
		var pending []string // NULL for a run that named no blob
		if len(sums) > 0 {
			pending = sums
		}
		if _, err := tx.Exec(ctx, "UPDATE runs SET journal_removed_at = now(), blobs_pending = $2 WHERE run_id = $1", runID, pending); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "DELETE FROM journal_events WHERE run_id = $1", runID)
		return err
	})
}

// retain runs RemoveExpired every retentionInterval until ctx ends.
func (p *Projector) retain(ctx context.Context) {
	t := time.NewTicker(retentionInterval(p.cfg.Retention))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := p.RemoveExpired(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			p.log.Warn("retention pass failed", "err", err)
		case n > 0:
			p.log.Info("retention removed finished runs' journals", "runs", n, "retention", p.cfg.Retention)
		}
	}
}
