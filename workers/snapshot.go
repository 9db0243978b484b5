package workers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
)

// Snapshots (PAL_SNAPSHOTS, eventstore/snapshot.go) let a drive of a long
// run on a worker that has not kept its state (folded.go) read only the
// journal after the snapshot's head. A run is snapshotted when it parks,
// and as its journal grows, once it holds snapshotFrom events: a shorter
// journal reads in a few milliseconds.
const (
	snapshotFrom = 1_000
	// A run is snapshotted again once its journal has grown by
	// snapshotEvery events since its last snapshot, or by 1/snapshotShare
	// of the journal when that is more. So the tail a resume after a crash
	// reads is at most that (1,250 events of a 20,000-event run, some
	// 30 ms), and writing states, which grow with the run, costs about the
	// same per event however long the run: each encode of a state of
	// several MiB takes the drive tens of milliseconds (a 10,000-iteration
	// loop takes some 8% longer than with no snapshots).
	snapshotEvery = 1_000
	snapshotShare = 16
	// snapshotRuns bounds the runs whose last snapshot a worker remembers;
	// past it they are forgotten, and each is snapshotted once early.
	snapshotRuns = 4096
)

// snapshotInterval is how many events a journal of after events grows by
// between snapshots: the most a resume's tail holds.
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

// getSnapshot returns run runID's snapshot: its header, and its encoded
// state, not yet decoded.
func getSnapshot(ctx context.Context, store *eventstore.Store, runID string) (snapshotHeader, []byte, error) {
	b, err := store.GetSnapshot(ctx, runID)
	if err != nil {
		return snapshotHeader{}, nil, err
	}
	nl := bytes.IndexByte(b, '\n')
	if nl < 0 {
		return snapshotHeader{}, nil, errors.New("snapshot has no header")
	}
	var h snapshotHeader
	if err := json.Unmarshal(b[:nl], &h); err != nil {
		return snapshotHeader{}, nil, fmt.Errorf("snapshot header: %w", err)
	}
	if h.Version != engine.StateVersion {
		return snapshotHeader{}, nil, fmt.Errorf("snapshot version %d, want %d: %w", h.Version, engine.StateVersion, engine.ErrStateVersion)
	}
	return h, b[nl+1:], nil
}

func (h snapshotHeader) head() eventstore.Head {
	return eventstore.Head{Seq: h.Seq, StreamSeq: h.StreamSeq, Hash: h.Hash, Driver: h.Driver}
}

// openSnapshot decodes a snapshot's state and checks its head against
// the journal: a head whose message is not on the run's subject or does
// not hash to it is refused. The head carries its driver, so ReadAfter
// from it applies the writer rule from the first message on. Any trouble
// is an error, and the caller folds the journal instead.
func openSnapshot(ctx context.Context, store *eventstore.Store, runID string, h snapshotHeader, state []byte) (*folded, error) {
	st, err := engine.DecodeState(state)
	if err != nil {
		return nil, err
	}
	if st.RunID != runID || st.LastSeq != h.Seq || st.LastWorker != h.Driver {
		return nil, fmt.Errorf("snapshot of run %s at seq %d holds run %s at seq %d", runID, h.Seq, st.RunID, st.LastSeq)
	}
	if err := store.CheckHead(ctx, runID, h.head()); err != nil {
		return nil, err
	}
	return &folded{st: st, head: h.head(), earlier: h.Earlier}, nil
}

// resumeSnapshot is what a drive of run runID that kept no state starts
// from: r.from is the run's snapshot, checked, and r the journal after the
// snapshot's head, read (and verified, as any read is) while the state
// decodes and the head is checked, the two being independent. The drive
// folds the read on (loadFolded); a read that failed makes it read the
// whole journal, which meets the trouble as it would have.
func resumeSnapshot(ctx context.Context, store *eventstore.Store, runID string) (journalRead, error) {
	h, state, err := getSnapshot(ctx, store, runID)
	if err != nil {
		return journalRead{}, err
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	tail := make(chan journalRead, 1)
	go func() {
		var r journalRead
		r.evs, r.head, r.err = store.ReadAfter(rctx, runID, h.head())
		tail <- r
	}()
	f, err := openSnapshot(ctx, store, runID, h, state)
	if err != nil {
		return journalRead{}, err
	}
	var r journalRead
	select {
	case r = <-tail:
	case <-ctx.Done():
		return journalRead{}, ctx.Err()
	}
	r.from = f
	return r, nil
}

// foldOn applies evs, the journal after c's head, to c's state, and keeps
// the trace ids of the drives among them. An event that does not fold is
// an error, and c is then of no use.
func (c *folded) foldOn(evs []event.Event) error {
	for _, ev := range evs {
		if err := c.st.Apply(ev); err != nil {
			return err
		}
		if ev.Kind == event.RunResumed && ev.TraceID != "" {
			c.earlier = append(c.earlier, ev.TraceID)
		}
	}
	return nil
}

// snapshotFolded is resumeSnapshot for a drive: no snapshot (r.from nil)
// on any trouble, logged unless the run has none.
func (w *Worker) snapshotFolded(ctx context.Context, runID string) journalRead {
	r, err := resumeSnapshot(ctx, w.store, runID)
	if err != nil {
		if !errors.Is(err, eventstore.ErrNoSnapshot) && ctx.Err() == nil {
			w.log.Warn("ignoring the run's snapshot; folding its journal", "run_id", runID, "err", err)
		}
		return journalRead{}
	}
	w.snaps.mark(runID, r.from.head.Seq)
	return r
}

// snapshots counts the snapshot puts in flight (at most one per worker:
// one more is skipped, and the next append tries again) and the drives
// that started from a snapshot (tests). It remembers, by run, the seq of
// the last snapshot this worker put or resumed from, which spaces the
// next one.
type snapshots struct {
	busy atomic.Bool
	hits atomic.Int64
	puts atomic.Int64
	mu   sync.Mutex
	last map[string]uint64
}

// due reports whether run runID, its journal now at seq, has grown by a
// snapshot interval since its last snapshot here (none: since seq 0).
func (s *snapshots) due(runID string, seq uint64) bool {
	if seq < snapshotFrom {
		return false
	}
	s.mu.Lock()
	last := s.last[runID]
	s.mu.Unlock()
	return seq > last && seq-last >= snapshotInterval(seq)
}

// mark records a snapshot of run runID at seq; 0 forgets the run.
func (s *snapshots) mark(runID string, seq uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if seq == 0 {
		delete(s.last, runID)
		return
	}
	if s.last == nil || len(s.last) >= snapshotRuns {
		s.last = map[string]uint64{}
	}
	s.last[runID] = seq
}

// at reports whether this worker last snapshotted run runID at seq.
func (s *snapshots) at(runID string, seq uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last[runID] == seq
}

// keepSnapshot snapshots d's state at d's head, unless the last snapshot
// here is at that head: encoded now, as the state goes on changing, and
// put in the background, off the append's path. A put that fails is
// tried again an interval later, not at the next append: each try costs
// the drive an encode.
func (w *Worker) keepSnapshot(d *drive) {
	if d.st == nil || d.bug != nil || len(d.pending) > 0 || d.st.LastSeq != d.head.Seq || d.head.Seq < snapshotFrom {
		return
	}
	if w.snaps.at(d.runID, d.head.Seq) || !w.snaps.busy.CompareAndSwap(false, true) {
		return
	}
	w.snaps.mark(d.runID, d.head.Seq)
	b, err := encodeSnapshot(d.st, d.head, d.token.earlier)
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
	w.snaps.mark(d.runID, 0)
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
