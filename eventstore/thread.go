package eventstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/internal/retry"
)

// Threads (docs/architecture.md §5.1): one subject per thread in
// PAL_THREADS, one event.ThreadRecord per message, chained by event.Link.
const (
	ThreadsStream = "PAL_THREADS"
	ThreadsPrefix = "pal.threads."
)

// ThreadSubject is the subject of a thread's records.
func ThreadSubject(id string) string { return ThreadsPrefix + id }

// ThreadLimits bound one thread: its turns and the bytes of its records
// together. Zero fields take event.DefaultThreadMaxTurns and
// event.DefaultThreadMaxBytes.
type ThreadLimits struct {
	MaxTurns int
	MaxBytes int
}

func (l ThreadLimits) withDefaults() ThreadLimits {
	if l.MaxTurns <= 0 {
		l.MaxTurns = event.DefaultThreadMaxTurns
	}
	if l.MaxBytes <= 0 {
		l.MaxBytes = event.DefaultThreadMaxBytes
	}
	return l
}

// Full returns an error wrapping ErrThreadFull when thread t is at its
// bound already: a thread step refuses to start on it.
func (l ThreadLimits) Full(t event.Thread) error {
	l = l.withDefaults()
	if len(t.Turns) >= l.MaxTurns {
		return fmt.Errorf("%w: thread %s holds %d turns, its limit (PAL_THREAD_MAX_TURNS %d): start runs on a new thread (a node's threadWindow bounds what a request sends, not what the thread keeps)", ErrThreadFull, t.ID, len(t.Turns), l.MaxTurns)
	}
	if t.Bytes >= l.MaxBytes {
		return fmt.Errorf("%w: thread %s holds %d bytes, its limit (PAL_THREAD_MAX_BYTES %d): start runs on a new thread", ErrThreadFull, t.ID, t.Bytes, l.MaxBytes)
	}
	return nil
}

// ErrThreadFull is wrapped by AppendThread's refusal of a record that
// would take the thread past its ThreadLimits.
var ErrThreadFull = errors.New("thread full")

// ErrThreadMoved is returned by AppendThread when another writer appended
// to the thread after the Thread it was given: read it again.
var ErrThreadMoved = errors.New("thread moved on")

// threadBatch is how many records one Direct Get of a thread carries.
const threadBatch = 256

// ReadThread reads and verifies thread id from its first record: the
// empty thread when it has none. Errors: event.ErrInvalidThreadID; a
// corrupt thread's (a record that does not decode or does not follow the
// one before, event.Link); JetStream's.
func (s *Store) ReadThread(ctx context.Context, id string) (event.Thread, error) {
	if err := event.ValidateThreadID(id); err != nil {
		return event.Thread{}, err
	}
	return retry.Value(ctx, jsRetry, func() (event.Thread, error) {
		c := event.NewThreadChain(id)
		var after uint64
		for {
			n := 0
			err := s.directBatch(ctx, ThreadsStream, directRequest{Seq: after + 1, NextBySubj: ThreadSubject(id), Batch: threadBatch},
				threadBatch, func(m directMsg) error {
					n++
					after = m.Sequence
					return c.Next(m.Data, m.Sequence, StampOf(m.Header, Answered))
				})
			switch {
			case errors.Is(err, errNoMessages):
				return c.Thread, nil
			case err != nil && transient(err):
				return event.Thread{}, err
			case err != nil:
				return event.Thread{}, retry.Permanent(fmt.Errorf("reading thread %s: %w", id, err))
			case n < threadBatch:
				return c.Thread, nil
			}
		}
	})
}

// AppendThread appends rec to thread t (as ReadThread returned it),
// fenced on t's last stream sequence and deduplicated by
// event.ThreadMsgID: a record that landed once is not stored again.
// It stamps rec's thread, seq, prev and v, and returns the thread with
// rec folded in. Errors: ErrThreadFull (rec would take the thread past
// limits; nothing is written), ErrThreadMoved (another writer appended
// first), JetStream's.
func (s *Store) AppendThread(ctx context.Context, t event.Thread, rec event.ThreadRecord, limits ThreadLimits) (event.Thread, error) {
	if err := event.ValidateThreadID(t.ID); err != nil {
		return t, err
	}
	limits = limits.withDefaults()
	rec.V, rec.Thread, rec.Seq, rec.Prev = 1, t.ID, t.Seq+1, t.Hash
	body, err := json.Marshal(rec)
	if err != nil {
		return t, err
	}
	if n := len(t.Turns) + len(rec.Turns); len(rec.Turns) > 0 && n > limits.MaxTurns {
		return t, fmt.Errorf("%w: thread %s would hold %d turns; the limit is %d", ErrThreadFull, t.ID, n, limits.MaxTurns)
	}
	if n := t.Bytes + len(body); rec.Kind != event.ThreadClose && n > limits.MaxBytes {
		return t, fmt.Errorf("%w: thread %s would hold %d bytes; the limit is %d", ErrThreadFull, t.ID, n, limits.MaxBytes)
	}
	msg := &nats.Msg{Subject: ThreadSubject(t.ID), Data: body, Header: nats.Header{}}
	ack, err := retry.Value(ctx, jsRetry, func() (*jetstream.PubAck, error) {
		ack, err := s.js.PublishMsg(ctx, msg, jetstream.WithMsgID(event.ThreadMsgID(rec)), jetstream.WithExpectStream(ThreadsStream),
			jetstream.WithExpectLastSequencePerSubject(t.StreamSeq), jetstream.WithRetryWait(pubRetryWait))
		switch {
		case err == nil:
			return ack, nil
		case isWrongLastSeq(err):
			return nil, retry.Permanent(ErrThreadMoved)
		case transient(err):
			return nil, err
		}
		return nil, retry.Permanent(err)
	})
	if err != nil {
		return t, fmt.Errorf("appending %s of %s/%s to thread %s: %w", rec.Kind, rec.RunID, rec.StepID, t.ID, err)
	}
	if ack.Duplicate {
		// Stored before (a lost ack): the caller reads the thread again.
		return t, ErrThreadMoved
	}
	c := event.ThreadChain{Thread: t}
	if err := c.Next(body, ack.Sequence, event.Stamp{MsgID: event.ThreadMsgID(rec)}); err != nil {
		return t, err
	}
	return c.Thread, nil
}

// ThreadTail returns the stream sequence of thread id's last record (0
// for none): one Direct Get, so a waiter can tell that the thread has not
// moved without reading it (StreamSeq of the Thread ReadThread returns).
func (s *Store) ThreadTail(ctx context.Context, id string) (uint64, error) {
	if err := event.ValidateThreadID(id); err != nil {
		return 0, err
	}
	var seq uint64
	err := s.directOne(ctx, ThreadsStream, directRequest{LastBySubj: ThreadSubject(id)}, 1, func(m directMsg) error {
		seq = m.Sequence
		return nil
	})
	if errors.Is(err, errNoMessages) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("reading the tail of thread %s: %w", id, err)
	}
	return seq, nil
}

func threadStreamConfig(cfg Config) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        ThreadsStream,
		Description: "PAL threads: one subject per conversation, turns chained like a journal",
		Subjects:    []string{ThreadsPrefix + "*"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
		MaxMsgSize:  cfg.MaxEventBytes,
		Duplicates:  2 * time.Minute,
		AllowDirect: true,
		DenyDelete:  true,
	}
}

// RunEnded reports whether run runID has ended: its last journal message
// holds a terminal event, or it has no journal (retention removed it).
// One Direct Get, not verified (as LastHead).
func (s *Store) RunEnded(ctx context.Context, runID string) (bool, error) {
	if err := checkRunID(runID); err != nil {
		return false, err
	}
	m, err := s.events.GetLastMsgForSubject(ctx, EventsSubject(runID))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading the end of run %s: %w", runID, err)
	}
	evs, err := event.Decode(m.Data)
	if err != nil {
		return false, fmt.Errorf("reading the end of run %s: %w", runID, err)
	}
	return evs[len(evs)-1].Kind.Terminal(), nil
}
