package eventstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/internal/retry"
)

// Head is a writer's view of the end of a run's journal.
type Head struct {
	// Seq is the run-level seq of the last event (0 before run_created).
	Seq uint64
	// StreamSeq is the PAL_EVENTS sequence of the last message on the
	// run's subject (0 when there is none); appends are fenced on it.
	StreamSeq uint64
}

// Store reads and appends run journals.
type Store struct {
	js      jetstream.JetStream
	events  jetstream.Stream
	work    jetstream.Stream
	maxMsg  int
	pack    bool
	timeout time.Duration
}

// Option configures a Store.
type Option func(*Store)

// WithPacking makes Append carry all the events of one call in one message
// (a JSON array), so a step boundary costs one append. PAL uses it in
// strict durability mode, where every append is an fsync.
func WithPacking(on bool) Option { return func(s *Store) { s.pack = on } }

// WithRequestTimeout bounds each JetStream request (default 5s).
func WithRequestTimeout(d time.Duration) Option { return func(s *Store) { s.timeout = d } }

// Open returns a Store over streams created by Setup.
func Open(ctx context.Context, js jetstream.JetStream, opts ...Option) (*Store, error) {
	s := &Store{js: js, timeout: 5 * time.Second}
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
	return s, nil
}

// MaxEventBytes is the largest message the journal accepts; an event
// whose JSON comes near it cannot be appended.
func (s *Store) MaxEventBytes() int { return s.maxMsg }

// JetStream returns the JetStream context the store uses.
func (s *Store) JetStream() jetstream.JetStream { return s.js }

// Append writes evs after head, fenced: it succeeds only if head is still
// the end of the run's journal. It fills in v, run_id, seq and (when zero)
// ts, and returns the new head.
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
	groups := [][]event.Event{evs}
	if !s.pack {
		groups = make([][]event.Event, len(evs))
		for i := range evs {
			groups[i] = evs[i : i+1]
		}
	}
	// Encode and size-check every message before publishing any, so an
	// oversized event refuses the whole append instead of half-applying it.
	bodies := make([][]byte, len(groups))
	for i, g := range groups {
		body, err := s.encode(runID, g)
		if err != nil {
			return head, err
		}
		bodies[i] = body
	}
	for i, g := range groups {
		h, err := s.publish(ctx, runID, head, g, bodies[i])
		if err != nil {
			return head, err
		}
		head = h
	}
	return head, nil
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

func (s *Store) publish(ctx context.Context, runID string, head Head, evs []event.Event, body []byte) (Head, error) {
	msgID := runID + ":" + strconv.FormatUint(evs[0].Seq, 10)
	msg := &nats.Msg{Subject: EventsSubject(runID), Data: body, Header: nats.Header{}}
	msg.Header.Set(kindHeader, kindsOf(evs))
	last := evs[len(evs)-1].Seq

	return retry.Value(ctx, jsRetry, func() (Head, error) {
		pctx, cancel := context.WithTimeout(ctx, s.timeout)
		ack, err := s.js.PublishMsg(pctx, msg,
			jetstream.WithMsgID(msgID),
			jetstream.WithExpectStream(EventsStream),
			jetstream.WithExpectLastSequencePerSubject(head.StreamSeq))
		cancel()
		if err == nil && !ack.Duplicate {
			return Head{Seq: last, StreamSeq: ack.Sequence}, nil
		}
		if err == nil || isWrongLastSeq(err) {
			// Wrong sequence (or a duplicate id): either an earlier try of
			// this very append landed and its ack was lost, or another
			// writer appended first.
			h, err := s.checkLanded(ctx, runID, head, msgID, body, last)
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

// checkLanded resolves a wrong-sequence answer: either our earlier try
// landed (its ack was lost) or someone else appended. Nats-Msg-Id names
// only the run and seq, which a competing writer shares, so the append is
// ours only if the stored message is byte for byte what we sent (the body
// carries the writer's id and a nanosecond timestamp). It looks at the
// first message after head rather than the last one, so an append is
// recognised even when more landed after it (an unpacked Append re-sent
// whole after its acks were lost).
func (s *Store) checkLanded(ctx context.Context, runID string, head Head, msgID string, body []byte, last uint64) (Head, error) {
	return retry.Value(ctx, jsRetry, func() (Head, error) {
		gctx, cancel := context.WithTimeout(ctx, s.timeout)
		m, err := s.events.GetMsg(gctx, head.StreamSeq+1, jetstream.WithGetMsgSubject(EventsSubject(runID)))
		cancel()
		if err == nil && m.Header.Get(jetstream.MsgIDHeader) == msgID && bytes.Equal(m.Data, body) {
			return Head{Seq: last, StreamSeq: m.Sequence}, nil
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
// It uses batched Direct Get. Errors: ErrRunNotFound when the run has no
// events.
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
// head. An empty result with head unchanged means nothing new.
//
// Completeness is checked, not assumed: every batched reply carries the
// number of matching messages still pending after it, and reading goes on
// until that reaches zero.
func (s *Store) ReadAfter(ctx context.Context, runID string, head Head) ([]event.Event, Head, error) {
	if err := checkRunID(runID); err != nil {
		return nil, head, fmt.Errorf("reading: %w", err)
	}
	subj := EventsSubject(runID)
	var out []event.Event
	err := retry.Do(ctx, jsRetry, func() error {
		for {
			batch, h, pending, err := s.readBatch(ctx, subj, head)
			if err != nil {
				err = fmt.Errorf("reading run %s: %w", runID, err)
				if !transient(err) && !errors.Is(err, errIncompleteBatch) {
					return retry.Permanent(err)
				}
			}
			// Keep what arrived intact, and on a failure retry from there.
			out, head = append(out, batch...), h
			if err != nil || pending == 0 {
				return err
			}
		}
	})
	if err != nil {
		return nil, head, err
	}
	return out, head, nil
}

// readBatch reads one batch after head. It returns the decoded events, the
// head after them and how many matching messages are still pending.
func (s *Store) readBatch(ctx context.Context, subj string, head Head) ([]event.Event, Head, uint64, error) {
	rctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	msgs, err := jetstreamext.GetBatch(rctx, s.js, EventsStream, readBatch,
		jetstreamext.GetBatchSubject(subj), jetstreamext.GetBatchSeq(head.StreamSeq+1))
	if err != nil {
		return nil, head, 0, err
	}
	var out []event.Event
	pending := uint64(1) // unknown until a reply says otherwise
	for m, err := range msgs {
		if errors.Is(err, jetstreamext.ErrNoMessages) {
			return out, head, 0, nil
		}
		if err != nil {
			return out, head, pending, err
		}
		evs, err := event.Decode(m.Data)
		if err != nil {
			return out, head, pending, fmt.Errorf("stream seq %d: %w", m.Sequence, err)
		}
		h := head
		for _, ev := range evs {
			if ev.Seq != h.Seq+1 {
				return out, head, pending, fmt.Errorf("journal gap: seq %d follows %d", ev.Seq, h.Seq)
			}
			h.Seq = ev.Seq
		}
		h.StreamSeq = m.Sequence
		out, head = append(out, evs...), h
		if pending, err = strconv.ParseUint(m.Header.Get(numPendingHeader), 10, 64); err != nil {
			return out, head, 1, fmt.Errorf("stream seq %d: bad %s header", m.Sequence, numPendingHeader)
		}
	}
	if len(out) == 0 {
		// No reply at all and no "no messages": the request timed out.
		return out, head, pending, errIncompleteBatch
	}
	return out, head, pending, nil
}

// LastHead returns the current head of a run without reading its events
// (one Direct Get). A run with no events has the zero Head.
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
	evs, err := event.Decode(m.Data)
	if err != nil {
		return Head{}, fmt.Errorf("reading head of run %s: %w", runID, err)
	}
	return Head{Seq: evs[len(evs)-1].Seq, StreamSeq: m.Sequence}, nil
}

func kindsOf(evs []event.Event) string {
	if len(evs) == 1 {
		return string(evs[0].Kind)
	}
	ks := make([]string, len(evs))
	for i, ev := range evs {
		ks[i] = string(ev.Kind)
	}
	return strings.Join(ks, ",")
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
// a leader election that ends within a second.
var jsRetry = retry.Policy{Initial: 20 * time.Millisecond, Max: time.Second, Multiplier: 1.5, Jitter: 0.5}
