package workers

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/eventstore"
)

// SetBeforeDrive makes w run hook at the start of each drive, before the
// journal is read: a test's way to make a drive fail where the journal
// cannot count it.
func SetBeforeDrive(w *Worker, hook func(runID string)) { w.beforeDrive.Store(&hook) }

// FoldedHits counts the drives of w that started from a state it kept
// when it parked the run (folded.go).
func FoldedHits(w *Worker) int {
	return int(w.folded.hits.Load())
}

// SnapshotHits counts the drives of w that started from a run's snapshot,
// and SnapshotPuts the snapshots it wrote (snapshot.go).
func SnapshotHits(w *Worker) int64 { return w.snaps.hits.Load() }
func SnapshotPuts(w *Worker) int64 { return w.snaps.puts.Load() }

// LoadSnapshot is what a drive of run runID with no kept state starts
// from: its snapshot, checked against the journal.
func LoadSnapshot(ctx context.Context, store *eventstore.Store, runID string) (*engine.RunState, eventstore.Head, error) {
	h, state, err := getSnapshot(ctx, store, runID)
	if err != nil {
		return nil, eventstore.Head{}, err
	}
	f, err := openSnapshot(ctx, store, runID, h, state)
	if err != nil {
		return nil, eventstore.Head{}, err
	}
	return f.st, f.head, nil
}

// ResumeSnapshot is what a drive of run runID on a worker that has not
// seen it starts from: its snapshot, checked, and the journal after it,
// read while the snapshot decodes, folded on.
func ResumeSnapshot(ctx context.Context, store *eventstore.Store, runID string) (*engine.RunState, eventstore.Head, error) {
	r, err := resumeSnapshot(ctx, store, runID)
	if err != nil {
		return nil, eventstore.Head{}, err
	}
	f := r.from
	if r.err != nil || len(r.evs) == 0 {
		// The drive's own read meets what stopped this one.
		return f.st, f.head, nil
	}
	if err := f.foldOn(r.evs); err != nil {
		return nil, eventstore.Head{}, fmt.Errorf("folding the journal after the snapshot of run %s: %w", runID, err)
	}
	// Kept as a drive keeps it: the head names the run's driver.
	head := r.head
	head.Driver = f.st.LastWorker
	return f.st, head, nil
}

// EncodeSnapshot is the snapshot a worker writes of st folded through
// head.
func EncodeSnapshot(st *engine.RunState, head eventstore.Head) ([]byte, error) {
	return encodeSnapshot(st, head, nil)
}

// SnapshotInterval is how many events a journal of n events grows by
// between a worker's snapshots of it: a resume's tail is at most that long.
func SnapshotInterval(n int) int { return int(snapshotInterval(uint64(n))) }

// PresenceProbeEvery is how often a worker probes each peer (presence.go).
const PresenceProbeEvery = presenceProbeEvery

// ProbeByHand makes w, before Start, probe its peers' presence only when
// the test calls probe, once per call, instead of every
// PresenceProbeEvery. probe returns how many probes it sent; they are in
// the connection's buffer when it returns.
func ProbeByHand(w *Worker) (probe func() int) {
	w.probeByHand = true
	return func() int { return w.presence.probeAll() }
}

// Handle drives the run of work message msg, fetched by the test, as the
// worker's fetch loop does, and returns when the drive is over.
func Handle(ctx context.Context, w *Worker, msg jetstream.Msg) { w.handle(ctx, msg) }
