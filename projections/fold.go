package projections

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"sort"
	"sync/atomic"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"github.com/nats-io/nats.go"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/readmodel"
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

// decoded is one stream message: its stream sequence, the run of its
// subject and its exact bytes. The folder verifies and decodes it
// (event.Chain), per run, in stream order.
type decoded struct {
	streamSeq uint64
	runID     string
	body      []byte
	stamp     event.Stamp
}

// decodedOf is the message at streamSeq on subject, delivered by a
// consumer with the headers hdr; ok is false for a subject that names no
// run.
func decodedOf(streamSeq uint64, subject string, body []byte, hdr nats.Header) (decoded, bool) {
	runID, ok := eventstore.RunIDFromEvents(subject)
	if !ok {
		return decoded{}, false
	}
	return decoded{streamSeq: streamSeq, runID: runID, body: body, stamp: eventstore.StampOf(hdr, eventstore.Delivered)}, true
}

// batch is what one transaction writes.
type batch struct {
	journal  []journalRow
	runs     []readmodel.RunRow
	steps    []readmodel.StepRow
	receipts []readmodel.ReceiptRow
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

// folder turns messages into rows with the engine's fold, after each run's
// chain (event.Chain) has verified them. It keeps the folded state and the
// chain of recently active runs, so a message costs one verification and
// one Apply per event; a run it has not got (cache miss, restart) is
// folded afresh from its journal in JetStream, up to the message at hand.
// It is used by one goroutine.
type folder struct {
	cache *stateCache
	// scan reads a run's messages between two stream sequences
	// (eventstore.Store.Scan).
	scan func(ctx context.Context, runID string, after, before uint64, fn func(uint64, []byte, event.Stamp)) error
	// earlier reports which runs have a message at or before a stream
	// sequence (eventstore.Store.Earlier).
	earlier func(ctx context.Context, runIDs []string, upTo uint64) (map[string]bool, error)
	// resolve puts back the big values the events name (PAL_BLOBS,
	// eventstore.Store.ResolveBlobs): the journal rows keep the events as
	// stored, the fold and the derived rows get the values.
	resolve func(ctx context.Context, evs []event.Event) error
	log     *slog.Logger
	stats   *counters
	// hook, when set (tests), runs before each message's events are
	// folded (not for a run already broken).
	hook func(runID string)
}

// fold adds msgs to pb. It fails only when ctx ends (while reading a
// journal from JetStream): a run whose journal does not fold still gets its
// journal rows, is logged and counted, and gets no more derived rows; a
// message that does not verify gets no row and is never folded, and its
// run reads failed (journal_corrupt).
func (f *folder) fold(ctx context.Context, pb *pending, msgs []decoded) error {
	byRun := map[string][]decoded{}
	var order []string
	for _, m := range msgs {
		pb.lastStreamSeq = max(pb.lastStreamSeq, m.streamSeq)
		if m.runID == "" {
			continue // not a run's message: it only moves the checkpoint
		}
		if _, ok := byRun[m.runID]; !ok {
			order = append(order, m.runID)
		}
		byRun[m.runID] = append(byRun[m.runID], m)
	}
	fresh, err := f.fresh(ctx, msgs, order)
	if err != nil {
		return err
	}
	for _, run := range order {
		if err := f.foldRun(ctx, pb, run, byRun[run], fresh[run]); err != nil {
			return err
		}
	}
	return nil
}

// fresh finds the runs of msgs, not cached, whose journal starts within
// msgs, so they need no read from JetStream. It knows only when msgs is a
// gap-free run of stream sequences (every PAL_EVENTS message is a journal
// message): then a run with nothing at or before the first of them has
// nothing before its first message here either. One batched Direct Get
// answers for all the runs.
func (f *folder) fresh(ctx context.Context, msgs []decoded, order []string) (map[string]bool, error) {
	if f.earlier == nil || len(msgs) == 0 {
		return nil, nil
	}
	seqs := make([]uint64, len(msgs))
	for i, m := range msgs {
		seqs[i] = m.streamSeq
	}
	slices.Sort(seqs)
	seqs = slices.Compact(seqs)
	if seqs[len(seqs)-1]-seqs[0] != uint64(len(seqs)-1) {
		return nil, nil // a redelivery out of order: read each run
	}
	var unknown []string
	for _, run := range order {
		if !f.cache.Contains(run) {
			unknown = append(unknown, run)
		}
	}
	if len(unknown) == 0 {
		return nil, nil
	}
	has, err := f.earlier(ctx, unknown, seqs[0]-1)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, nil // read each run instead
	}
	fresh := map[string]bool{}
	for _, run := range unknown {
		fresh[run] = !has[run]
	}
	return fresh, nil
}

// errFoldPanic marks a fold that panicked.
var errFoldPanic = errors.New("folding panicked")

// apply folds one message's events into st. A panic is recovered and
// returned as an error matching errFoldPanic, logged with the stream
// sequence: the run is then broken like a journal that does not fold
// (its journal rows are written, no derived rows), and the projector goes
// on; the checkpoint moves past, so nothing loops.
func (f *folder) apply(runID string, st *engine.RunState, evs []event.Event, streamSeq uint64) (err error) {
	defer func() {
		if r := recover(); r != nil {
			f.log.Error("folding a run panicked", "run", runID, "stream_seq", streamSeq, "panic", r, "stack", string(debug.Stack()))
			err = fmt.Errorf("%w: %v", errFoldPanic, r)
		}
	}()
	if f.hook != nil {
		f.hook(runID)
	}
	for _, ev := range evs {
		if err := st.Apply(ev); err != nil {
			return err
		}
	}
	return nil
}

// foldRun verifies and applies one run's messages and records the run in pb.
// fresh says the run's journal starts within msgs.
func (f *folder) foldRun(ctx context.Context, pb *pending, runID string, msgs []decoded, fresh bool) error {
	// A redelivered older message may follow a newer one.
	sort.SliceStable(msgs, func(i, j int) bool { return msgs[i].streamSeq < msgs[j].streamSeq })
	e, _ := f.cache.Get(runID)
	var prev uint64 // rows changed after prev are written
	if e != nil {
		prev = e.st.LastSeq
		for len(msgs) > 0 && msgs[0].streamSeq <= e.stream {
			msgs = msgs[1:] // already taken
		}
	}
	if len(msgs) == 0 {
		return nil
	}
	withBlobs := false
	if e == nil && fresh {
		e, withBlobs = &cacheEntry{st: &engine.RunState{}, chain: event.Chain{RunID: runID}}, true
	}
	if e == nil {
		var err error
		if e, err = f.rebuild(ctx, runID, msgs[0].streamSeq); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			// Its messages still get their journal rows, below.
			f.broken(runID, e, err)
		}
		// A state folded afresh writes all its rows: the guards make the
		// unchanged ones no-ops, and a missing one comes back.
		prev, withBlobs = 0, true
	}
	var foldErr error
	panicked := false
	for _, m := range msgs {
		evs, err := e.chain.NextStamped(m.body, m.stamp)
		e.stream = m.streamSeq
		if err != nil {
			f.stats.malformed.Add(1)
			f.log.Error("skipping a journal message that does not verify", "run", runID, "stream_seq", m.streamSeq, "err", err)
			continue
		}
		for _, ev := range evs {
			if k := (runSeq{runID, ev.Seq}); !pb.seen[k] {
				pb.seen[k] = true
				pb.journal = append(pb.journal, journalRowOf(ev, m.streamSeq))
			}
		}
		if len(evs) == 0 || e.broken || foldErr != nil {
			continue
		}
		if e.synth {
			// The seal of a run this folder failed itself: fold afresh,
			// seal included, so the rows carry the seal as written.
			ne, err := f.rebuild(ctx, runID, m.streamSeq+1)
			if err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				foldErr, e = err, ne
				continue
			}
			e, prev, withBlobs = ne, 0, true
			continue
		}
		if err := f.resolve(ctx, evs); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			foldErr = err
			continue
		}
		if err := f.apply(runID, e.st, evs, m.streamSeq); err != nil {
			foldErr = err
			panicked = errors.Is(err, errFoldPanic)
		}
	}
	if foldErr == nil && !e.broken {
		f.markCorrupt(e)
	}
	if panicked {
		// The state may be half applied: write none of it.
		if _, ok := pb.touched[runID]; ok {
			delete(pb.touched, runID)
			pb.order = slices.DeleteFunc(pb.order, func(id string) bool { return id == runID })
		}
	} else if t, ok := pb.touched[runID]; ok {
		t.st, t.prev, t.withBlobs = e.st, min(t.prev, prev), t.withBlobs || withBlobs
	} else if !e.broken || foldErr != nil {
		pb.touched[runID] = &touchedRun{st: e.st, prev: prev, withBlobs: withBlobs}
		pb.order = append(pb.order, runID)
	}
	switch {
	case foldErr != nil:
		f.broken(runID, e, foldErr)
	case e.broken:
		f.cache.Add(runID, e)
	case e.st.Status.Terminal() && !e.synth:
		f.cache.Remove(runID) // nothing follows a terminal event
	default:
		f.cache.Add(runID, e) // a synthesised end waits for its seal
	}
	return nil
}

// markCorrupt fails the state of a run whose journal does not verify and
// has no seal yet, as every reader shows it (engine.RunState.Corrupt).
func (f *folder) markCorrupt(e *cacheEntry) {
	c := e.chain.Corrupt
	if c == nil || e.chain.Sealed || e.synth || e.st.Status.Terminal() {
		return
	}
	if err := e.st.Corrupt(c); err != nil {
		f.log.Error("failing a run with a corrupt journal", "run", c.RunID, "err", err)
		return
	}
	e.synth = true
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

// rebuild folds a run's journal from JetStream, the messages before
// stream sequence before, through a fresh chain.
func (f *folder) rebuild(ctx context.Context, runID string, before uint64) (*cacheEntry, error) {
	e := &cacheEntry{st: &engine.RunState{}, chain: event.Chain{RunID: runID}}
	f.stats.loads.Add(1)
	var evs []event.Event
	err := f.scan(ctx, runID, 0, before, func(streamSeq uint64, body []byte, st event.Stamp) {
		got, _ := e.chain.NextStamped(body, st)
		evs, e.stream = append(evs, got...), streamSeq
	})
	if err != nil {
		return e, err
	}
	if err := f.resolve(ctx, evs); err != nil {
		return e, err
	}
	st, err := engine.Fold(evs)
	e.st = st
	if err != nil {
		return e, err
	}
	f.markCorrupt(e)
	return e, nil
}

// broken records a run whose journal does not fold: it keeps its journal
// rows and the rows of the state before the error, and gets no more.
func (f *folder) broken(runID string, e *cacheEntry, err error) {
	f.stats.foldErrors.Add(1)
	f.log.Error("run journal does not fold; projecting its journal rows only", "run", runID, "err", err)
	e.broken = true
	f.cache.Add(runID, e)
}

// addRows adds the rows of st that changed after seq prev.
func (f *folder) addRows(b *batch, st *engine.RunState, prev uint64, withBlobs bool, keys map[string]bool) {
	if st.LastSeq <= prev || st.LastSeq == 0 {
		return
	}
	b.runs = append(b.runs, readmodel.RunRowOf(st, withBlobs))
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
			b.steps = append(b.steps, readmodel.StepRowOf(st.RunID, s, a))
			if !a.Claimed {
				continue
			}
			r := readmodel.ReceiptRowOf(st.RunID, s, a)
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

// cacheEntry is a run's folded state and the chain that verified it.
type cacheEntry struct {
	st    *engine.RunState
	chain event.Chain
	// stream is the stream sequence of the last message the chain took.
	stream uint64
	// broken marks a journal that does not fold; synth a state this
	// folder failed (journal_corrupt) before the seal was read.
	broken bool
	synth  bool
}

// stateCache is an LRU of folded run states by run id. The folder is used
// by one goroutine, so it needs no lock.
type stateCache = simplelru.LRU[string, *cacheEntry]

// newStateCache returns a cache of at most n states (at least 1).
func newStateCache(n int) *stateCache {
	c, _ := simplelru.NewLRU[string, *cacheEntry](max(n, 1), nil) // fails only for a size below 1
	return c
}
