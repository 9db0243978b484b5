package eventstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// PurgeJournal removes every message of the run's subject from
// PAL_EVENTS (a purge filtered on pal.events.<run_id>): retention's
// removal of a finished run's journal. Nothing else of the stream moves.
// Purging a run with no messages is not an error.
func (s *Store) PurgeJournal(ctx context.Context, runID string) error {
	if err := checkRunID(runID); err != nil {
		return fmt.Errorf("purging journal: %w", err)
	}
	if err := s.events.Purge(ctx, jetstream.WithPurgeSubject(EventsSubject(runID))); err != nil {
		return fmt.Errorf("purging the journal of run %s: %w", runID, err)
	}
	return nil
}

// ErrPurgeDenied is returned by CheckPurgeable for a PAL_EVENTS that
// denies purges: one made before retention existed, which JetStream cannot
// change.
var ErrPurgeDenied = errors.New(EventsStream + " denies purges (it was created by a PAL before retention); " +
	"JetStream cannot lift deny_purge: archive it (nats stream backup " + EventsStream + "), " +
	"then recreate it without deny_purge (nats stream restore of the backup with deny_purge false), or leave PAL_RETENTION unset")

// CheckPurgeable reports whether retention can purge journals.
// Errors: ErrPurgeDenied.
func (s *Store) CheckPurgeable(ctx context.Context) error {
	info, err := s.events.Info(ctx)
	if err != nil {
		return fmt.Errorf("reading %s: %w", EventsStream, err)
	}
	if info.Config.DenyPurge {
		return ErrPurgeDenied
	}
	return nil
}
