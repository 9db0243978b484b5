package projections

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"sort"
	"sync/atomic"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
)

// counters are a projector's metrics.
type counters struct {
	events     atomic.Uint64
	batches    atomic.Uint64
	checkpoint atomic.Uint64
	foldErrors atomic.Uint64
	malformed  atomic.Uint64
	retries    atomic.Uint64
	loads      atomic.Uint64
}

// decoded is one stream message: its stream sequence and its events (one,
// or several consecutive ones of one run when packed).
type decoded struct {
	streamSeq uint64
	evs       []event.Event
}

// batch is what one transaction writes.
type batch struct {
	journal  []journalRow
	runs     []RunRow
	steps    []StepRow
	receipts []ReceiptRow
	// lastStreamSeq is the highest stream sequence of the batch: the
	// checkpoint once the batch commits.
	lastStreamSeq uint64
}

// pending is a batch being formed: its journal rows, and the runs its
// events changed. The runs, steps and receipts rows are made from the
// runs' states when the batch is handed to the writer (rows), so messages
// that arrive while the writer is busy join the batch and each run still
// gets one row per batch.
type pending struct {
	journal       []journalRow
	seen          map[runSeq]bool
	touched       map[string]*touchedRun
	order         []string
	lastStreamSeq uint64
	// msgs counts the stream messages in the batch.
	msgs int
}

type runSeq struct {
	run string
	seq uint64
}

// touchedRun is a run whose state the pending batch changed: rows that
// changed after prev are written.
type touchedRun struct {
	st        *engine.RunState
	prev      uint64
	withBlobs bool
}

func newPending() *pending {
	return &pending{seen: map[runSeq]bool{}, touched: map[string]*touchedRun{}}
}

// folder turns messages into rows with the engine's fold. It keeps the
// folded state of recently active runs, so an event costs one Apply; a run
// it has not got (cache miss, restart) or whose next event is not the one
// after its state (redelivery, gap) is folded afresh from its journal in
// JetStream. It is used by one goroutine.
type folder struct {
	cache *stateCache
	// load reads a run's whole journal (eventstore.Store.Read).
	load  func(ctx context.Context, runID string) ([]event.Event, error)
	log   *slog.Logger
	stats *counters
	// hook, when set (tests), runs before a run's events are folded
	// (not for a run already broken).
	hook func(runID string)
}

// fold adds msgs to pb. It fails only when ctx ends (while reading a
// journal from JetStream): a run whose journal does not fold still gets its
// journal rows, is logged and counted, and gets no more derived rows.
func (f *folder) fold(ctx context.Context, pb *pending, msgs []decoded) error {
	byRun := map[string][]event.Event{}
	lastSeq := map[string]uint64{} // a run's last stream seq, to log
	var order []string
	for _, m := range msgs {
		pb.lastStreamSeq = max(pb.lastStreamSeq, m.streamSeq)
		for _, ev := range m.evs {
			k := runSeq{ev.RunID, ev.Seq}
			if pb.seen[k] {
				continue // redelivered within the batch
			}
			pb.seen[k] = true
			pb.journal = append(pb.journal, journalRowOf(ev, m.streamSeq))
			if _, ok := byRun[ev.RunID]; !ok {
				order = append(order, ev.RunID)
			}
			byRun[ev.RunID] = append(byRun[ev.RunID], ev)
			lastSeq[ev.RunID] = m.streamSeq
		}
	}
	for _, run := range order {
		if err := f.foldRunSafe(ctx, pb, run, byRun[run], lastSeq[run]); err != nil {
			return err
		}
	}
	return nil
}

// foldRunSafe is foldRun with a panic recovered: the run is recorded as
// broken (its journal rows are written, no derived rows from now on),
// logged with the stream sequence, and the projector goes on. Its
// messages are not redelivered: the checkpoint moves past them, as for a
// journal that does not fold, so nothing loops.
func (f *folder) foldRunSafe(ctx context.Context, pb *pending, runID string, evs []event.Event, streamSeq uint64) (err error) {
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		f.log.Error("folding a run panicked", "run", runID, "stream_seq", streamSeq, "panic", r, "stack", string(debug.Stack()))
		// Its state may be half applied: write none of it.
		if _, ok := pb.touched[runID]; ok {
			delete(pb.touched, runID)
			pb.order = slices.DeleteFunc(pb.order, func(id string) bool { return id == runID })
		}
		f.broken(runID, &engine.RunState{}, fmt.Errorf("panic: %v", r))
		err = nil
	}()
	return f.foldRun(ctx, pb, runID, evs)
}

// foldRun applies one run's events to its state and records the run in pb.
func (f *folder) foldRun(ctx context.Context, pb *pending, runID string, evs []event.Event) error {
	// A redelivered older message may follow a newer one.
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].Seq < evs[j].Seq })
	e, _ := f.cache.Get(runID)
	if e != nil && e.broken {
		return nil
	}
	if f.hook != nil {
		f.hook(runID)
	}
	var st *engine.RunState
	var prev uint64 // rows changed after prev are written
	if e != nil {
		st, prev = e.st, e.st.LastSeq
	}
	for len(evs) > 0 && evs[0].Seq <= prev {
		evs = evs[1:] // already folded
	}
	if len(evs) == 0 {
		return nil
	}
	withBlobs := false
	if st == nil || evs[0].Seq != st.LastSeq+1 {
		var err error
		if st, err = f.rebuild(ctx, runID, evs[0].Seq-1); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			f.broken(runID, st, err)
			return nil
		}
		// A state folded afresh writes all its rows: the guards make the
		// unchanged ones no-ops, and a missing one comes back.
		prev, withBlobs = 0, true
	}
	var foldErr error
	for _, ev := range evs {
		if err := st.Apply(ev); err != nil {
			foldErr = err
			break
		}
	}
	if t, ok := pb.touched[runID]; ok {
		t.st, t.prev, t.withBlobs = st, min(t.prev, prev), t.withBlobs || withBlobs
	} else {
		pb.touched[runID] = &touchedRun{st: st, prev: prev, withBlobs: withBlobs}
		pb.order = append(pb.order, runID)
	}
	switch {
	case foldErr != nil:
		f.broken(runID, st, foldErr)
	case st.Status.Terminal():
		f.cache.Remove(runID) // nothing follows a terminal event
	default:
		f.cache.Add(runID, &cacheEntry{st: st})
	}
	return nil
}

// rows makes the batch pb stands for.
func (f *folder) rows(pb *pending) *batch {
	b := &batch{journal: pb.journal, lastStreamSeq: pb.lastStreamSeq}
	keys := map[string]bool{}
	for _, run := range pb.order {
		t := pb.touched[run]
		f.addRows(b, t.st, t.prev, t.withBlobs, keys)
	}
	return b
}

// rebuild folds a run's journal from JetStream up to seq upto.
func (f *folder) rebuild(ctx context.Context, runID string, upto uint64) (*engine.RunState, error) {
	st := &engine.RunState{}
	if upto == 0 {
		return st, nil
	}
	f.stats.loads.Add(1)
	evs, err := f.load(ctx, runID)
	if err != nil {
		return st, err
	}
	for _, ev := range evs {
		if ev.Seq > upto {
			break
		}
		if err := st.Apply(ev); err != nil {
			return st, err
		}
	}
	if st.LastSeq != upto {
		return st, fmt.Errorf("run %s: the journal in JetStream ends at seq %d, before seq %d", runID, st.LastSeq, upto)
	}
	return st, nil
}

// broken records a run whose journal does not fold: it keeps its journal
// rows and the rows of the state before the error, and gets no more.
func (f *folder) broken(runID string, st *engine.RunState, err error) {
	f.stats.foldErrors.Add(1)
	f.log.Error("run journal does not fold; projecting its journal rows only", "run", runID, "err", err)
	f.cache.Add(runID, &cacheEntry{st: st, broken: true})
}

// addRows adds the rows of st that changed after seq prev.
func (f *folder) addRows(b *batch, st *engine.RunState, prev uint64, withBlobs bool, keys map[string]bool) {
	if st.LastSeq <= prev || st.LastSeq == 0 {
		return
	}
	b.runs = append(b.runs, runRowOf(st, withBlobs))
	for _, id := range st.Order {
		s := st.Steps[id]
		for _, a := range s.Attempts {
			if a.LastSeq <= prev {
				continue
			}
			if !fitsInt32(a.Attempt) {
				f.log.Error("attempt number out of range; step attempt not projected", "run", st.RunID, "step", id, "attempt", a.Attempt)
				continue
			}
			b.steps = append(b.steps, stepRowOf(st.RunID, s, a))
			if !a.Claimed {
				continue
			}
			r := receiptRowOf(st.RunID, s, a)
			if r.IdempotencyKey != "" {
				if keys[r.IdempotencyKey] {
					f.log.Error("idempotency key claimed twice in one batch; receipt not projected", "run", st.RunID, "step", id, "attempt", a.Attempt)
					continue
				}
				keys[r.IdempotencyKey] = true
			}
			b.receipts = append(b.receipts, r)
		}
	}
}

// cacheEntry is a run's folded state; broken marks a journal that does not
// fold.
type cacheEntry struct {
	st     *engine.RunState
	broken bool
}

// stateCache is an LRU of folded run states by run id. The folder is used
// by one goroutine, so it needs no lock.
type stateCache = simplelru.LRU[string, *cacheEntry]

// newStateCache returns a cache of at most n states (at least 1).
func newStateCache(n int) *stateCache {
	c, _ := simplelru.NewLRU[string, *cacheEntry](max(n, 1), nil) // fails only for a size below 1
	return c
}
