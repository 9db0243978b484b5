package eventstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/palrun/pal/event"
)

// Snapshots of folded run states (docs/architecture.md §5, §10): a cache
// a worker fills so that a drive of a long run on a worker that has not
// seen it reads only the journal after the snapshot's head. The journal
// stays the truth: a reader checks the head against it (CheckHead) and
// reads what follows with the chain going on from that head.
const (
	SnapshotBucket = "PAL_SNAPSHOTS"
	SnapshotStream = "OBJ_" + SnapshotBucket
	// MaxSnapshot bounds a snapshot, written or read: a state bigger
	// than this is not kept, and a run that has it is folded from its
	// journal.
	MaxSnapshot = 8 << 20
)

// ErrNoSnapshot is GetSnapshot's error when a run has no snapshot.
var ErrNoSnapshot = errors.New("no snapshot")

func (s *Store) snapshotStore(ctx context.Context) (jetstream.ObjectStore, error) {
	return s.snaps.get(func() (jetstream.ObjectStore, error) {
		obs, err := s.js.ObjectStore(ctx, SnapshotBucket)
		if err != nil {
			return nil, fmt.Errorf("opening object store %s: %w", SnapshotBucket, err)
		}
		return obs, nil
	})
}

// PutSnapshot keeps b as run runID's snapshot, replacing any before.
func (s *Store) PutSnapshot(ctx context.Context, runID string, b []byte) error {
	if err := checkRunID(runID); err != nil {
		return fmt.Errorf("putting a snapshot: %w", err)
	}
	if len(b) > MaxSnapshot {
		return fmt.Errorf("snapshot of run %s: %d bytes, over %d", runID, len(b), MaxSnapshot)
	}
	obs, err := s.snapshotStore(ctx)
	if err != nil {
		return err
	}
	if _, err := obs.PutBytes(ctx, runID, b); err != nil {
		return fmt.Errorf("putting the snapshot of run %s: %w", runID, err)
	}
	return nil
}

// GetSnapshot returns run runID's snapshot: ErrNoSnapshot when there is
// none, an error when it is over MaxSnapshot.
func (s *Store) GetSnapshot(ctx context.Context, runID string) ([]byte, error) {
	if err := checkRunID(runID); err != nil {
		return nil, fmt.Errorf("getting a snapshot: %w", err)
	}
	obs, err := s.snapshotStore(ctx)
	if err != nil {
		return nil, err
	}
	r, err := obs.Get(ctx, runID)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, ErrNoSnapshot
	}
	if err != nil {
		return nil, fmt.Errorf("getting the snapshot of run %s: %w", runID, err)
	}
	defer func() { _ = r.Close() }()
	info, err := r.Info()
	if err != nil {
		return nil, fmt.Errorf("getting the snapshot of run %s: %w", runID, err)
	}
	if info.Size > MaxSnapshot {
		return nil, fmt.Errorf("snapshot of run %s: %d bytes, over %d", runID, info.Size, MaxSnapshot)
	}
	var buf bytes.Buffer
	buf.Grow(int(info.Size))
	// Reading to the end checks the object's digest (nats.go); an object
	// whose chunks hold more than its info says is cut short of its end,
	// unchecked, and refused.
	if _, err := io.Copy(&buf, io.LimitReader(r, MaxSnapshot+1)); err != nil {
		return nil, fmt.Errorf("getting the snapshot of run %s: %w", runID, err)
	}
	if buf.Len() > MaxSnapshot {
		return nil, fmt.Errorf("snapshot of run %s: over %d bytes", runID, MaxSnapshot)
	}
	return buf.Bytes(), nil
}

// DeleteSnapshot removes run runID's snapshot; none is no error.
func (s *Store) DeleteSnapshot(ctx context.Context, runID string) error {
	if err := checkRunID(runID); err != nil {
		return fmt.Errorf("deleting a snapshot: %w", err)
	}
	obs, err := s.snapshotStore(ctx)
	if err != nil {
		return err
	}
	if err := obs.Delete(ctx, runID); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
		return fmt.Errorf("deleting the snapshot of run %s: %w", runID, err)
	}
	return nil
}

// CheckHead checks that h is a head of run runID's journal: the message
// at stream sequence h.StreamSeq is on the run's subject, its bytes hash
// to h.Hash, and its last event is seq h.Seq (one Direct Get). A head
// from outside the journal (a snapshot's) is trusted only after this, and
// ReadAfter from it then verifies every message after it.
func (s *Store) CheckHead(ctx context.Context, runID string, h Head) error {
	if err := checkRunID(runID); err != nil {
		return fmt.Errorf("checking a head: %w", err)
	}
	if h.StreamSeq == 0 || h.Seq == 0 {
		return fmt.Errorf("checking a head of run %s: empty head", runID)
	}
	m, err := s.events.GetMsg(ctx, h.StreamSeq)
	if err != nil {
		return fmt.Errorf("checking a head of run %s at stream seq %d: %w", runID, h.StreamSeq, err)
	}
	if m.Subject != EventsSubject(runID) {
		return fmt.Errorf("checking a head of run %s: stream seq %d is on %s", runID, h.StreamSeq, m.Subject)
	}
	if event.Hash(m.Data) != h.Hash {
		return fmt.Errorf("checking a head of run %s: stream seq %d does not hash to the head's hash", runID, h.StreamSeq)
	}
	evs, err := event.Decode(m.Data)
	if err != nil || len(evs) == 0 || evs[len(evs)-1].Seq != h.Seq {
		return fmt.Errorf("checking a head of run %s: stream seq %d does not end at seq %d", runID, h.StreamSeq, h.Seq)
	}
	return nil
}
