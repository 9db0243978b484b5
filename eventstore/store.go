package eventstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/internal/retry"
	"github.com/palrun/pal/internal/telemetry"
)

// Head is a writer's view of the end of a run's journal.
type Head struct {
	// Seq is the run-level seq of the last sound event (0 before
	// run_created); the next append gets Seq+1.
	Seq uint64
	// StreamSeq is the PAL_EVENTS sequence of the last message on the
	// run's subject (0 when there is none); appends are fenced on it.
	StreamSeq uint64
	// Hash is the hex sha256 of the last message's bytes (event.Hash): the
	// prev of the next append.
	Hash string
	// Driver, when the caller knows it, is the worker_id of the run's
	// latest run_resumed up to this head: ReadAfter then applies the
	// writer rule from the first message on, as a read from the start
	// does. Unset (as in every head the store returns), the rule applies
	// from the next run_resumed (event.Chain.Tail).
	Driver string
}

// chain returns the verifier that continues after h. A head does not say
// who drives the run, so a chain from a non-zero head applies the writer
// rule from the next run_resumed on (event.Chain.Tail); a read from the
// start (Read, a zero head) applies it throughout.
func (h Head) chain(runID string) event.Chain {
	return event.Chain{RunID: runID, Seq: h.Seq, Hash: h.Hash, Driver: h.Driver, Tail: h.Seq > 0 && h.Driver == ""}
}

// after returns the head after a message the chain c took at stream
// sequence streamSeq.
func after(c *event.Chain, streamSeq uint64) Head {
	return Head{Seq: c.Seq, StreamSeq: streamSeq, Hash: c.Hash}
}

// Store reads and appends run journals.
type Store struct {
	js     jetstream.JetStream
	events jetstream.Stream
	work   jetstream.Stream
	maxMsg int
	// apiPrefix is the JetStream API's subject prefix ($JS.API.).
	apiPrefix string
	pack      bool
	timeout   time.Duration
	// inflight is the PAL_INFLIGHT index, opened by the first listing
	// (the sweep's): other roles write it by subject only.
	inflight lazy[jetstream.KeyValue]
	// blobThreshold is the size above which a step value goes to
	// PAL_BLOBS (blob.go); blobs is that store, opened on first use.
	blobThreshold int
	blobs         lazy[jetstream.ObjectStore]
	refs          lazy[jetstream.Stream] // PAL_BLOB_REFS (blobref.go)
	blobCache     *blobCache
	// snaps is PAL_SNAPSHOTS (snapshot.go), opened on first use.
	snaps lazy[jetstream.ObjectStore]
	// workflows is PAL_WORKFLOWS (workflows.go), opened on first use;
	// versions keeps the versions read, checked (workflows.go).
	workflows lazy[jetstream.KeyValue]
	versions  *lru.Cache[string, DeployedWorkflow]
	// schedules is PAL_SCHEDULES (schedules.go), opened on first use.
	schedules lazy[jetstream.KeyValue]
	// group commits packed appends in atomic batches (group.go); nil
	// without packing.
	group *groupCommit
	// reads counts what the store has read of the journal (ReadStats).
	reads readStats
}

// lazy holds a handle a store opens on first use (most processes never
// need it); an open that fails is tried again by the next use.
type lazy[T any] struct {
	mu   sync.Mutex
	v    T
	done bool
}

func (l *lazy[T]) get(open func() (T, error)) (T, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.done {
		v, err := open()
		if err != nil {
			return v, err
		}
		l.v, l.done = v, true
	}
	return l.v, nil
}

// Option configures a Store.
type Option func(*Store)

// packFrom is the fewest events an Append carries in one message without
// packing: a flush of several concurrent steps' events (a fan-out) is one
// round trip, where one message per event would be as many, one after
// the other, each fenced on the ack of the one before (§12). A step
// boundary of a run going one step at a time (a completion and the next
// start) stays one message per event.
const packFrom = 4

// WithPacking makes Append carry all the events of one call in one message
// (a JSON array), so a step boundary costs one append. PAL uses it in
// strict durability mode, where every append is an fsync.
func WithPacking(on bool) Option { return func(s *Store) { s.pack = on } }

// WithRequestTimeout bounds each JetStream request (default 5s).
func WithRequestTimeout(d time.Duration) Option { return func(s *Store) { s.timeout = d } }

// Open returns a Store over streams created by Setup.
func Open(ctx context.Context, js jetstream.JetStream, opts ...Option) (*Store, error) {
	s := &Store{js: js, timeout: 5 * time.Second, apiPrefix: apiPrefix(js.Options()), blobCache: newBlobCache(), versions: newVersionCache()}
	for _, o := range opts {
		o(s)
	}
	var err error
	if s.events, err = js.Stream(ctx, EventsStream); err != nil {
		return nil, fmt.Errorf("opening stream %s: %w", EventsStream, err)
	}
	if s.work, err = js.Stream(ctx, WorkStream); err != nil {
		return nil, fmt.Errorf("opening stream %s: %w", WorkStream, err)
	}
	s.maxMsg = int(s.events.CachedInfo().Config.MaxMsgSize)
	if mp := int(js.Conn().MaxPayload()); s.maxMsg <= 0 || (mp > 0 && mp < s.maxMsg) {
		s.maxMsg = mp
	}
	s.clampBlobThreshold()
	if s.pack && s.events.CachedInfo().Config.AllowAtomicPublish {
		s.group = newGroupCommit(js, s.timeout)
	}
	return s, nil
}

// MaxEventBytes is the largest message the journal accepts; an event
// whose JSON comes near it cannot be appended.
func (s *Store) MaxEventBytes() int { return s.maxMsg }

// JetStream returns the JetStream context the store uses.
func (s *Store) JetStream() jetstream.JetStream { return s.js }

// Append writes evs after head, fenced: it succeeds only if head is still
// the end of the run's journal. It fills in v, run_id, seq and (when zero)
// ts, prev (the head's Hash, so every event of a packed message carries
// the same prev) and returns the new head.
//
// Without packing each event is one message and Append publishes them in
// order; if one fails, the returned head covers those that landed. An
// oversized event refuses the whole append before anything is published.
// Transient failures (timeouts, no responders, a reconnecting connection)
// are retried until ctx ends; a retry whose first try had landed is
// recognised by its Nats-Msg-Id and content. So is a whole Append called
// again with the same head and the same (stamped) events after it landed:
// it returns the same head and writes nothing.
//
// Errors: *ConflictError (matches ErrConflict) when the journal moved on;
// ErrPayloadTooLarge; an invalid run id (event.ValidateRunID); ctx.Err()
// when ctx ends first.
func (s *Store) Append(ctx context.Context, runID string, head Head, evs ...event.Event) (Head, error) {
	start := time.Now()
	h, err := s.append(ctx, runID, head, "", evs, nil)
	observeAppend(start, evs[:h.Seq-head.Seq], err)
	return h, err
}

// StartLag is how long after a start's work message its run_created may
// still land, the two being published together (AppendStart): workers
// look for the journal of a start's work about this long before they drop
// the work (workers/startlag.go says how, and why).
const StartLag = 30 * time.Second

// AppendStart appends a run's run_created, fenced on an empty subject as
// Append with Head{} is, and publishes the run's work message (reason) on
// its queue q beside it: sent once the event is encoded, just before it is
// published, so that the start waits for both acks at once
// (docs/architecture.md §8 step 3). queued waits for the work message's
// ack; when the append took over a third of StartLag, or the work message
// was not sent, it enqueues the run anew instead (a no-op while the first
// work message is pending), as workers may have given up on the first.
// queued is nil only with an error.
func (s *Store) AppendStart(ctx context.Context, q, runID string, ev event.Event, reason string) (_ Head, queued func(context.Context) error, _ error) {
	start := time.Now()
	evs := []event.Event{ev}
	h, err := s.append(ctx, runID, Head{}, "", evs, func() { queued = s.enqueueAsync(q, runID, reason) })
	observeAppend(start, evs[:h.Seq], err)
	if err == nil && (queued == nil || time.Since(start) > StartLag/3) {
		queued = func(ctx context.Context) error { return s.Enqueue(ctx, q, runID, reason) }
	}
	return h, queued, err
}

// observeAppend is where appends are measured (latency by result) and
// counted (runs started and finished: every writer appends through here);
// landed are the events that landed.
func observeAppend(start time.Time, landed []event.Event, err error) {
	result := "ok"
	switch {
	case errors.Is(err, ErrConflict):
		result = "conflict"
	case err != nil:
		result = "error"
	}
	kinds := make([]string, len(landed))
	for i, ev := range landed {
		kinds[i] = string(ev.Kind)
	}
	telemetry.Appended(time.Since(start), result, kinds)
}

// append is Append with a suffix for each message's Nats-Msg-Id.
// beside, if not nil, is called once every message is encoded, before the
// first is published.
func (s *Store) append(ctx context.Context, runID string, head Head, idSuffix string, evs []event.Event, beside func()) (Head, error) {
	if err := checkRunID(runID); err != nil {
		return head, fmt.Errorf("appending: %w", err)
	}
	if len(evs) == 0 {
		return head, nil
	}
	now := time.Now().UTC()
	for i := range evs {
		evs[i].V = event.Version
		evs[i].RunID = runID
		evs[i].Seq = head.Seq + uint64(i) + 1
		if evs[i].TS.IsZero() {
			evs[i].TS = now
		}
		if len(evs[i].Data) == 0 {
			evs[i].Data = []byte("{}")
		}
	}
	// The caller keeps its events as they were; the stored ones carry
	// references to the big values, put before anything is published.
	stored, err := s.externalize(ctx, evs)
	if err != nil {
		return head, err
	}
	groups := [][]event.Event{stored}
	if !s.pack && len(stored) < packFrom {
		groups = make([][]event.Event, len(stored))
		for i := range stored {
			groups[i] = stored[i : i+1]
		}
	}
	// Encode and size-check every message before publishing any, so an
	// oversized event refuses the whole append instead of half-applying it.
	// Each message's prev is the hash of the one before it, so the bodies
	// are chained here, before anything is sent.
	bodies := make([][]byte, 0, len(groups))
	prev := head.Hash
	for i := 0; i < len(groups); i++ {
		g := groups[i]
		for j := range g {
			g[j].Prev = prev
		}
		body, err := s.encode(runID, g)
		if errors.Is(err, ErrPayloadTooLarge) && len(g) > 1 {
			// A packed message of several values near the threshold can
			// pass the message size: it is split in two, each half a
			// message of its own (no event is ever inline above the
			// threshold, so a single one always fits).
			half := len(g) / 2
			groups = slices.Insert(groups, i+1, g[half:])
			groups[i] = g[:half]
			i--
			continue
		}
		if err != nil {
			return head, err
		}
		bodies = append(bodies[:i], body)
		prev = event.Hash(body)
	}
	for i := range evs {
		evs[i].Prev = stored[i].Prev
	}
	if beside != nil {
		beside()
	}
	for i, g := range groups {
		h, err := s.publish(ctx, runID, head, g, bodies[i], idSuffix)
		if err != nil {
			return head, err
		}
		head = h
	}
	if evs[len(evs)-1].Kind.Terminal() {
		s.unmarkAsync(runID)
	}
	return head, nil
}

// advance returns the head after evs, appended in one message body that
// landed at stream sequence streamSeq.
func advance(evs []event.Event, body []byte, streamSeq uint64) Head {
	return Head{Seq: evs[len(evs)-1].Seq, StreamSeq: streamSeq, Hash: event.Hash(body)}
}

// encode marshals one message's events and checks its size.
func (s *Store) encode(runID string, evs []event.Event) ([]byte, error) {
	body, err := event.Encode(evs...)
	if err != nil {
		return nil, err
	}
	if s.maxMsg > 0 && len(body)+256 > s.maxMsg {
		return nil, fmt.Errorf("%w: run %s seq %d (%s) is %d bytes, the stream accepts %d",
			ErrPayloadTooLarge, runID, evs[0].Seq, evs[0].Kind, len(body), s.maxMsg)
	}
	return body, nil
}

// journalMsg is the message that carries evs, encoded as body, and its
// Nats-Msg-Id.
func journalMsg(runID string, evs []event.Event, body []byte, idSuffix string) (*nats.Msg, string) {
	msg := &nats.Msg{Subject: EventsSubject(runID), Data: body, Header: nats.Header{}}
	msg.Header.Set(kindHeader, event.KindsOf(evs))
	return msg, runID + ":" + strconv.FormatUint(evs[0].Seq, 10) + idSuffix
}

func (s *Store) publish(ctx context.Context, runID string, head Head, evs []event.Event, body []byte, idSuffix string) (Head, error) {
	msg, msgID := journalMsg(runID, evs, body, idSuffix)
	return retry.Value(ctx, jsRetry, func() (Head, error) {
		pctx, cancel := context.WithTimeout(ctx, s.timeout)
		var ack *jetstream.PubAck
		err := errGroupFailed
		if s.group != nil {
			ack, err = s.group.publish(pctx, msg, msgID, head.StreamSeq)
		}
		if errors.Is(err, errGroupFailed) {
			ack, err = publishFenced(pctx, s.js, msg, msgID, head.StreamSeq)
		}
		cancel()
		if err == nil && !ack.Duplicate {
			return advance(evs, body, ack.Sequence), nil
		}
		if err == nil || isWrongLastSeq(err) {
			// Wrong sequence (or a duplicate id): either an earlier try of
			// this very append landed and its ack was lost, or another
			// writer appended first.
			h, err := s.checkLanded(ctx, runID, head, msgID, evs, body)
			return h, retry.Permanent(err)
		}
		if isTooLarge(err) {
			return head, retry.Permanent(fmt.Errorf("%w: run %s seq %d: %v", ErrPayloadTooLarge, runID, evs[0].Seq, err))
		}
		err = fmt.Errorf("appending to run %s: %w", runID, err)
		if !transient(err) {
			return head, retry.Permanent(err)
		}
		return head, err
	})
}

// publishFenced publishes one journal message on its own, fenced on the
// subject's last sequence expect and deduplicated by msgID.
func publishFenced(ctx context.Context, js jetstream.JetStream, msg *nats.Msg, msgID string, expect uint64) (*jetstream.PubAck, error) {
	return js.PublishMsg(ctx, msg, jetstream.WithMsgID(msgID), jetstream.WithExpectStream(EventsStream),
		jetstream.WithExpectLastSequencePerSubject(expect), jetstream.WithRetryWait(pubRetryWait))
}

// checkLanded resolves a wrong-sequence answer: either our earlier try
// landed (its ack was lost) or someone else appended. Nats-Msg-Id names
// only the run and seq, which a competing writer shares, so the append is
// ours only if the stored message is byte for byte what we sent (the body
// carries the writer's id and a nanosecond timestamp). It looks at the
// first message after head rather than the last one, so an append is
// recognised even when more landed after it (an unpacked Append re-sent
// whole after its acks were lost).
func (s *Store) checkLanded(ctx context.Context, runID string, head Head, msgID string, evs []event.Event, body []byte) (Head, error) {
	return retry.Value(ctx, jsRetry, func() (Head, error) {
		gctx, cancel := context.WithTimeout(ctx, s.timeout)
		m, err := s.events.GetMsg(gctx, head.StreamSeq+1, jetstream.WithGetMsgSubject(EventsSubject(runID)))
		cancel()
		if err == nil && m.Header.Get(jetstream.MsgIDHeader) == msgID && bytes.Equal(m.Data, body) &&
			StampOf(m.Header, Answered).Echo == "" {
			return advance(evs, body, storedSeq(m)), nil
		}
		if err == nil || errors.Is(err, jetstream.ErrMsgNotFound) {
			ce := &ConflictError{RunID: runID, Expected: head.Seq}
			if h, herr := s.LastHead(ctx, runID); herr == nil {
				ce.Actual = h.Seq
			}
			return head, retry.Permanent(ce)
		}
		err = fmt.Errorf("appending to run %s: checking the journal after a conflict: %w", runID, err)
		if !transient(err) {
			return head, retry.Permanent(err)
		}
		return head, err
	})
}

// Read returns every event of a run, in order, and the head after them.
// It uses batched Direct Get and verifies every message (event.Chain).
// Big values are put back from PAL_BLOBS (blob.go); a reference that does
// not hold returns event.ErrBlob with the events read (their values not
// all back) and the head. Errors: ErrRunNotFound when the run has no
// events; *event.CorruptError
// (matches event.ErrJournalCorrupt) when the journal does not verify and
// no seal follows: the events are then the sound ones before the bad
// message, and the head is where a seal is appended (Seq after the sound
// events, StreamSeq and Hash of the subject's last message).
func (s *Store) Read(ctx context.Context, runID string) ([]event.Event, Head, error) {
	evs, head, err := s.ReadAfter(ctx, runID, Head{})
	if err == nil && len(evs) == 0 {
		return nil, head, fmt.Errorf("reading run %s: %w", runID, ErrRunNotFound)
	}
	return evs, head, err
}

// readBatch is how many messages one Direct Get batch asks for.
const readBatch = 512

// numPendingHeader carries, on each batched Direct Get reply, how many
// matching messages follow it.
const numPendingHeader = "Nats-Num-Pending"

// errIncompleteBatch reports a batch that ended before the server said it
// was complete (the reply stream stalled or timed out).
var errIncompleteBatch = errors.New("direct get batch ended early")

// ReadAfter returns the events of a run written after head, and the new
// head. An empty result with head unchanged means nothing new. Messages
// are verified as Read does, continuing the chain from head (a head does
// not say who drives the run, so after a non-zero head the writer rule
// starts at the next run_resumed); the errors are Read's, bar ErrRunNotFound.
//
// Completeness is checked, not assumed: every batched reply carries the
// number of matching messages still pending after it, and reading goes on
// until that reaches zero.
func (s *Store) ReadAfter(ctx context.Context, runID string, head Head) ([]event.Event, Head, error) {
	return s.readAfter(ctx, runID, head, true)
}

// ReadAfterRefs is ReadAfter with big values left as their references,
// the events as stored, as Watch gives them: the event feeds send one
// form whether an event was read or watched (docs/architecture.md §6.4).
// Its errors are ReadAfter's bar event.ErrBlob, as no blob is read.
func (s *Store) ReadAfterRefs(ctx context.Context, runID string, head Head) ([]event.Event, Head, error) {
	return s.readAfter(ctx, runID, head, false)
}

func (s *Store) readAfter(ctx context.Context, runID string, head Head, resolve bool) ([]event.Event, Head, error) {
	if err := checkRunID(runID); err != nil {
		return nil, head, fmt.Errorf("reading: %w", err)
	}
	chain := head.chain(runID)
	var out []event.Event
	err := s.scan(ctx, runID, head.StreamSeq, 0, func(streamSeq uint64, body []byte, st event.Stamp) bool {
		evs, _ := chain.NextStamped(body, st) // a bad message is recorded in chain.Corrupt
		out, head = append(out, evs...), after(&chain, streamSeq)
		return true
	})
	if err != nil {
		return nil, head, err
	}
	if resolve {
		if err := s.resolve(ctx, out); err != nil {
			if errors.Is(err, event.ErrBlob) {
				return out, head, err // the events, not all of their values back
			}
			return nil, head, err
		}
	}
	if chain.Corrupt != nil && !chain.Sealed {
		return out, head, chain.Corrupt
	}
	return out, head, nil
}

// Scan passes the exact bytes of every message on a run's subject after
// stream sequence after and before stream sequence before (0: no bound),
// in order, to fn: what an export writes. A reader that folds them uses
// ScanStamped.
func (s *Store) Scan(ctx context.Context, runID string, after, before uint64, fn func(streamSeq uint64, body []byte)) error {
	return s.ScanStamped(ctx, runID, after, before, func(seq uint64, body []byte, _ event.Stamp) { fn(seq, body) })
}

// ScanStamped is Scan with each message's stamp (StampOf), for fn to
// verify them (event.Chain.NextStamped): the projector folds its runs
// this way from where its own chain stands, and the receipt signer signs
// only what PAL wrote.
func (s *Store) ScanStamped(ctx context.Context, runID string, after, before uint64, fn func(streamSeq uint64, body []byte, st event.Stamp)) error {
	if err := checkRunID(runID); err != nil {
		return fmt.Errorf("reading: %w", err)
	}
	return s.scan(ctx, runID, after, before, func(seq uint64, body []byte, st event.Stamp) bool { fn(seq, body, st); return true })
}

// scan is Scan without the run id check, and fn may stop it by returning
// false. Each message reaches fn once: a batch that fails is retried from
// the message after the last one fn took.
func (s *Store) scan(ctx context.Context, runID string, after, before uint64, fn func(uint64, []byte, event.Stamp) bool) error {
	subj := EventsSubject(runID)
	first := true
	return retry.Do(ctx, jsRetry, func() error {
		for {
			// The first batch is one message asked for over the
			// connection's shared reply subscription: most reads (a
			// fresh run's, a parked run's tail) end there, and skip
			// the subscription of a longer batch.
			size := 1
			if !first {
				size = readBatch
			}
			last, pending, stopped, err := s.readBatch(ctx, subj, after, before, size, 0, fn)
			after = last
			if stopped {
				return nil
			}
			if err != nil {
				err = fmt.Errorf("reading run %s: %w", runID, err)
				if !transient(err) && !errors.Is(err, errIncompleteBatch) {
					return retry.Permanent(err)
				}
				return err
			}
			first = false
			if pending == 0 {
				return nil
			}
		}
	})
}

// readBatch reads one batch of at most size messages after stream
// sequence after (and before before, unless 0), passing each to fn; the
// server ends it early once it has sent maxBytes (0: its own bound). It
// returns the stream sequence of the last message fn took, how many
// matching messages are still pending, and whether fn stopped the read.
func (s *Store) readBatch(ctx context.Context, subj string, after, before uint64, size, maxBytes int, fn func(uint64, []byte, event.Stamp) bool) (last, pending uint64, stopped bool, err error) {
	read := false
	pending = 1 // unknown until a reply says otherwise
	errBefore, errStop := errors.New("past before"), errors.New("stopped")
	get := s.directBatch
	if size == 1 {
		get = s.directOne
	}
	err = get(ctx, EventsStream, directRequest{Seq: after + 1, NextBySubj: subj, Batch: size, MaxBytes: maxBytes}, size,
		func(m directMsg) error {
			if before > 0 && m.Sequence >= before {
				return errBefore
			}
			n, perr := strconv.ParseUint(served(m.Header, numPendingHeader), 10, 64)
			if perr != nil {
				// Before fn takes the message, so a retry reads it again.
				return fmt.Errorf("stream seq %d: bad %s header", m.Sequence, numPendingHeader)
			}
			more := fn(m.Sequence, m.Data, StampOf(m.Header, Answered))
			after, pending, read = m.Sequence, n, true
			if !more {
				return errStop
			}
			return nil
		})
	switch {
	case errors.Is(err, errStop):
		return after, pending, true, nil
	case errors.Is(err, errNoMessages), errors.Is(err, errBefore):
		return after, 0, false, nil
	case err != nil:
		return after, pending, false, err
	case !read:
		// An end-of-batch marker with nothing before it.
		return after, 0, false, nil
	}
	return after, pending, false, nil
}

// LastHead returns the current head of a run without reading its events
// (one Direct Get of the last message, not verified: Read verifies). A run
// with no events has the zero Head. Its Hash is the last message's.
func (s *Store) LastHead(ctx context.Context, runID string) (Head, error) {
	if err := checkRunID(runID); err != nil {
		return Head{}, fmt.Errorf("reading head: %w", err)
	}
	m, err := s.events.GetLastMsgForSubject(ctx, EventsSubject(runID))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return Head{}, nil
	}
	if err != nil {
		return Head{}, fmt.Errorf("reading head of run %s: %w", runID, err)
	}
	s.reads.messages.Add(1)
	s.reads.bytes.Add(uint64(len(m.Data)))
	evs, err := event.Decode(m.Data)
	if err != nil {
		return Head{}, fmt.Errorf("reading head of run %s: %w", runID, err)
	}
	return Head{Seq: evs[len(evs)-1].Seq, StreamSeq: storedSeq(m), Hash: event.Hash(m.Data)}, nil
}

// storedSeq is the stream sequence of a journal message read by Direct
// Get (PAL_EVENTS allows it): the server's own Nats-Sequence (served),
// which nats.go's m.Sequence is not when the message carries one of its
// own (a stored answer).
func storedSeq(m *jetstream.RawStreamMsg) uint64 {
	if seq, err := strconv.ParseUint(served(m.Header, jetstream.SequenceHeader), 10, 64); err == nil {
		return seq
	}
	return m.Sequence
}

func isWrongLastSeq(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
}

func isTooLarge(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum {
		return true
	}
	return errors.Is(err, nats.ErrMaxPayload)
}

// transient reports whether a JetStream call may succeed if tried again.
func transient(err error) bool {
	switch {
	case errors.Is(err, context.Canceled):
		return false
	case errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, nats.ErrTimeout),
		errors.Is(err, nats.ErrNoResponders),
		errors.Is(err, jetstream.ErrNoStreamResponse),
		errors.Is(err, nats.ErrDisconnected),
		errors.Is(err, jetstream.ErrJetStreamNotEnabled):
		return true
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		// 503s: JetStream temporarily unavailable (cluster leader election, restart).
		return apiErr.Code == 503
	}
	return false
}

// jsRetry paces the event store's retries of a JetStream call that failed
// transiently (see transient): quick at first, since most such failures are
// a leader election, and never more than 250 ms apart, so a write lands
// within a quarter second of the new leader (a wait of up to 1 s here made
// the slowest leader kills stall 2.2 s instead of 1.5 s).
var jsRetry = retry.Policy{Initial: 20 * time.Millisecond, Max: 250 * time.Millisecond, Multiplier: 1.5, Jitter: 0.5}

// pubRetryWait is how long a publish that found no stream to answer it (no
// leader yet) waits before nats.go tries again, instead of its 250 ms.
const pubRetryWait = 50 * time.Millisecond

// Seal ends a run whose journal is corrupt: it appends cerr's seal
// (run_failed, code journal_corrupt) written by writer, fenced on head,
// the head Read returned with cerr, so the seal is chained on the
// subject's last message, bad or not. It returns the seal as written and
// the new head. A journal whose bad message follows the run's end
// (cerr.AfterEnd) is refused: the run keeps its end. Errors: Append's
// (a *ConflictError when the subject moved on meanwhile: read it again).
func (s *Store) Seal(ctx context.Context, runID string, head Head, cerr *event.CorruptError, writer string) (event.Event, Head, error) {
	if cerr.AfterEnd {
		return event.Event{}, head, fmt.Errorf("sealing run %s: it ended before its bad message (seq %d); nothing to seal", runID, cerr.Seq)
	}
	ev := cerr.Seal()
	ev.WorkerID = writer
	// The seal's Nats-Msg-Id names the message it is chained on, so a bad
	// message that took "<run_id>:<seq>" cannot hold the seal off for the
	// dedup window, and no message can take the seal's id before it: that
	// would need one whose id holds its own hash.
	start := time.Now()
	h, err := s.append(ctx, runID, head, ":seal-"+head.Hash[:min(16, len(head.Hash))], []event.Event{ev}, nil)
	observeAppend(start, []event.Event{ev}[:h.Seq-head.Seq], err)
	if err != nil {
		return ev, head, fmt.Errorf("sealing the corrupt journal of run %s: %w", runID, err)
	}
	ev.V, ev.RunID, ev.Seq, ev.Prev = event.Version, runID, h.Seq, head.Hash
	return ev, h, nil
}

// multiLastBatch caps the subjects of one multi-last Direct Get.
const multiLastBatch = 256

// Earlier reports which of runIDs have a message at or before stream
// sequence upTo, with one batched Direct Get per 256 runs: the projector
// learns this way that a run it meets for the first time starts in the
// batch at hand and needs no read. Errors: an invalid run id; JetStream's.
func (s *Store) Earlier(ctx context.Context, runIDs []string, upTo uint64) (map[string]bool, error) {
	has := map[string]bool{}
	if upTo == 0 {
		return has, nil
	}
	for len(runIDs) > 0 {
		n := min(len(runIDs), multiLastBatch)
		subjects := make([]string, n)
		for i, id := range runIDs[:n] {
			if err := checkRunID(id); err != nil {
				return nil, fmt.Errorf("reading: %w", err)
			}
			subjects[i] = EventsSubject(id)
		}
		runIDs = runIDs[n:]
		err := retry.Do(ctx, jsRetry, func() error {
			err := s.directBatch(ctx, EventsStream, directRequest{MultiLastFor: subjects, UpToSeq: upTo}, len(subjects),
				func(m directMsg) error {
					if id, ok := RunIDFromEvents(m.Subject); ok {
						has[id] = true
					}
					return nil
				})
			if errors.Is(err, errNoMessages) {
				return nil
			}
			if err != nil {
				err = fmt.Errorf("reading the journal up to stream seq %d: %w", upTo, err)
				if !transient(err) && !errors.Is(err, errIncompleteBatch) {
					return retry.Permanent(err)
				}
			}
			return err
		})
		if err != nil {
			return nil, err
		}
	}
	return has, nil
}
