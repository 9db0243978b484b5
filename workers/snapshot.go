package workers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/eventstore"
)

// Snapshots (PAL_SNAPSHOTS, eventstore/snapshot.go) let a drive of a long
// run on a worker that has not kept its state (folded.go) read only the
// journal after the snapshot's head. A run is snapshotted when it parks,
// and as its journal grows, once it holds snapshotFrom events: a shorter
// journal reads in a few milliseconds.
const (
	snapshotFrom = 1_000
	// A snapshot is written every snapshotEvery events, or every
	// 1/snapshotShare of the journal when that is more, so writing states
	// (which grow with the run) costs about the same per event however
	// long the run. More often slowed every step of a long run: each put
	// of a state of several MiB takes CPU from the drive.
	snapshotEvery = 1_000
	snapshotShare = 2
)

// snapshotDue reports whether a journal that went from seq before to seq
// after has passed a snapshot point.
func snapshotDue(before, after uint64) bool {
	if after < snapshotFrom {
		return false
	}
	every := snapshotInterval(after)
	return after/every != before/every
}

// snapshotInterval is the number of events between snapshots of a
// journal of after events.
func snapshotInterval(after uint64) uint64 {
	return max(uint64(snapshotEvery), after/snapshotShare)
}

// snapshotHeader opens a snapshot: the head the state was folded at, and
// the trace ids of the run's drives. The encoded state follows a newline.
type snapshotHeader struct {
	Version   int      `json:"v"`
	Seq       uint64   `json:"seq"`
	StreamSeq uint64   `json:"stream_seq"`
	Hash      string   `json:"hash"`
	Driver    string   `json:"driver"`
	Earlier   []string `json:"earlier,omitempty"`
}

// encodeSnapshot encodes st, folded through head.
func encodeSnapshot(st *engine.RunState, head eventstore.Head, earlier []string) ([]byte, error) {
	state, err := engine.EncodeState(st)
	if err != nil {
		return nil, err
	}
	h, err := json.Marshal(snapshotHeader{Version: engine.StateVersion, Seq: head.Seq, StreamSeq: head.StreamSeq,
		Hash: head.Hash, Driver: st.LastWorker, Earlier: earlier})
	if err != nil {
		return nil, err
	}
	return append(append(h, '\n'), state...), nil
}

// loadSnapshot returns run runID's state from its snapshot, its head
// checked against the journal: a head whose message is not on the run's
// subject or does not hash to it is refused. The head carries its driver,
// so ReadAfter from it applies the writer rule from the first message on.
// Any trouble is an error, and the caller folds the journal instead.
func loadSnapshot(ctx context.Context, store *eventstore.Store, runID string) (*folded, error) {
	b, err := store.GetSnapshot(ctx, runID)
	if err != nil {
		return nil, err
	}
	nl := bytes.IndexByte(b, '\n')
	if nl < 0 {
		return nil, errors.New("snapshot has no header")
	}
	var h snapshotHeader
	if err := json.Unmarshal(b[:nl], &h); err != nil {
		return nil, fmt.Errorf("snapshot header: %w", err)
	}
	if h.Version != engine.StateVersion {
		return nil, fmt.Errorf("snapshot version %d, want %d: %w", h.Version, engine.StateVersion, engine.ErrStateVersion)
	}
	st, err := engine.DecodeState(b[nl+1:])
	if err != nil {
		return nil, err
	}
	if st.RunID != runID || st.LastSeq != h.Seq || st.LastWorker != h.Driver {
		return nil, fmt.Errorf("snapshot of run %s at seq %d holds run %s at seq %d", runID, h.Seq, st.RunID, st.LastSeq)
	}
	head := eventstore.Head{Seq: h.Seq, StreamSeq: h.StreamSeq, Hash: h.Hash, Driver: h.Driver}
	if err := store.CheckHead(ctx, runID, head); err != nil {
		return nil, err
	}
	return &folded{st: st, head: head, earlier: h.Earlier, at: time.Now()}, nil
}

// firstDrive reports whether work message msg is a run's start, taken for
// the first time: no drive can have snapshotted the run, so a drive of it
// does not look (a round trip less on every run's start).
func firstDrive(msg jetstream.Msg) bool {
	if msg == nil || eventstore.WorkReason(msg) != "start" {
		return false
	}
	meta, err := msg.Metadata()
	return err == nil && meta.NumDelivered == 1
}

// snapshotFolded is loadSnapshot for a drive: nil on any trouble, logged
// unless the run has no snapshot.
func (w *Worker) snapshotFolded(ctx context.Context, runID string) *folded {
	f, err := loadSnapshot(ctx, w.store, runID)
	if err != nil {
		if !errors.Is(err, eventstore.ErrNoSnapshot) && ctx.Err() == nil {
			w.log.Warn("ignoring the run's snapshot; folding its journal", "run_id", runID, "err", err)
		}
		return nil
	}
	return f
}

// snapshots counts the snapshot puts in flight (at most one per worker:
// one more is skipped, and the next point writes it) and the drives that
// started from a snapshot (tests).
type snapshots struct {
	busy atomic.Bool
	hits atomic.Int64
	puts atomic.Int64
}

// keepSnapshot snapshots d's state at d's head: encoded now, as the state
// goes on changing, and put in the background, off the append's path.
func (w *Worker) keepSnapshot(d *drive) {
	if d.st == nil || d.bug != nil || len(d.pending) > 0 || d.st.LastSeq != d.head.Seq || d.head.Seq < snapshotFrom {
		return
	}
	if !w.snaps.busy.CompareAndSwap(false, true) {
		return
	}
	b, err := encodeSnapshot(d.st, d.head, d.earlier)
	if err == nil && len(b) > eventstore.MaxSnapshot {
		err = fmt.Errorf("%d bytes, over %d", len(b), eventstore.MaxSnapshot)
	}
	if err != nil {
		w.snaps.busy.Store(false)
		d.log.Debug("not snapshotting the run", "err", err)
		return
	}
	w.drives.Add(1)
	go func() {
		defer w.drives.Done()
		defer w.snaps.busy.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := w.store.PutSnapshot(ctx, d.runID, b); err != nil {
			d.log.Warn("putting the run's snapshot", "err", err)
			return
		}
		w.snaps.puts.Add(1)
	}()
}

// dropSnapshot removes the snapshot of a run that ended, in the
// background: a left one is harmless (PAL_SNAPSHOTS' TTL ends it).
func (w *Worker) dropSnapshot(d *drive) {
	if d.st == nil || d.st.LastSeq < snapshotFrom {
		return
	}
	w.drives.Add(1)
	go func() {
		defer w.drives.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := w.store.DeleteSnapshot(ctx, d.runID); err != nil {
			d.log.Debug("deleting the run's snapshot", "err", err)
		}
	}()
}
