package eventstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/palrun/pal/event"
)

// InflightBucket indexes the runs that have not ended: the write side
// puts a run's key before its run_created and purges it after its
// terminal event, so the recovery sweep finds orphans by reading the
// runs in flight, never the finished ones (docs/architecture.md §11).
const InflightBucket = "PAL_INFLIGHT"

const (
	inflightStream = "KV_" + InflightBucket
	inflightPrefix = "$KV." + InflightBucket + "."
)

// Inflight is one entry of the index.
type Inflight struct {
	RunID string
	// Queue is the run's work queue (the entry's value; DefaultQueue for
	// an entry written before queues, whose value is empty).
	Queue    string
	Revision uint64
	Created  time.Time
}

// MarkInflight puts the run into the index, and returns a wait for the
// server's answer: runs.Start, and a subagent step for its child run, send
// it just before run_created and wait after, so the two round trips
// overlap. No run, top-level or child, then exists that the index does not
// name, unless the wait reports an error; an entry whose run_created never
// landed is removed by the sweep.
//
// The entry's value is the run's queue q (empty for the default queue), so
// the sweep looks for the run's work where it is.
func (s *Store) MarkInflight(q, runID string) func(context.Context) error {
	if err := checkWork(q, runID); err != nil {
		return func(context.Context) error { return fmt.Errorf("indexing: %w", err) }
	}
	msg := &nats.Msg{Subject: inflightPrefix + runID}
	if q != event.DefaultQueue {
		msg.Data = []byte(q)
	}
	ack, err := s.js.PublishMsgAsync(msg, jetstream.WithExpectStream(inflightStream))
	return func(ctx context.Context) error {
		if err == nil {
			err = awaitAck(ctx, ack, 0)
		}
		if err != nil {
			return fmt.Errorf("indexing run %s as in flight: %w", runID, err)
		}
		return nil
	}
}

// unmarkMsg is the purge of a run's entry, as KV Purge writes it.
func unmarkMsg(runID string) *nats.Msg {
	msg := &nats.Msg{Subject: inflightPrefix + runID, Header: nats.Header{}}
	msg.Header.Set("KV-Operation", "PURGE")
	msg.Header.Set("Nats-Rollup", "sub")
	// So that no other stream stores a copy a push consumer delivers
	// (docs/architecture.md §5.6); the server checks it on a plain publish too.
	msg.Header.Set(jetstream.ExpectedStreamHeader, inflightStream)
	return msg
}

// unmarkAsync purges the run's entry without waiting for the server: a
// lost purge leaves an entry the sweep removes when it finds the run's
// terminal event.
func (s *Store) unmarkAsync(runID string) { _ = s.js.Conn().PublishMsg(unmarkMsg(runID)) }

// UnmarkInflight purges a finished (or never created) run's entry: the
// undoing of MarkInflight.
func (s *Store) UnmarkInflight(ctx context.Context, runID string) error {
	if err := checkRunID(runID); err != nil {
		return fmt.Errorf("unindexing: %w", err)
	}
	if _, err := s.js.PublishMsg(ctx, unmarkMsg(runID), jetstream.WithExpectStream(inflightStream)); err != nil {
		return fmt.Errorf("unindexing run %s as in flight: %w", runID, err)
	}
	return nil
}

// InflightRuns lists the index, oldest entry first: one pass over the
// runs in flight (their queues are the only values).
func (s *Store) InflightRuns(ctx context.Context) ([]Inflight, error) {
	kv, err := s.inflight.get(func() (jetstream.KeyValue, error) { return s.js.KeyValue(ctx, InflightBucket) })
	if err != nil {
		return nil, fmt.Errorf("listing runs in flight: %w", err)
	}
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("listing runs in flight: %w", err)
	}
	var out []Inflight
	err = eachCurrent(ctx, w, "runs in flight", func(e jetstream.KeyValueEntry) (bool, error) {
		q := string(e.Value())
		if event.ValidateQueue(q) != nil {
			q = event.DefaultQueue // written before queues, or not by PAL
		}
		out = append(out, Inflight{RunID: e.Key(), Queue: q, Revision: e.Revision(), Created: e.Created()})
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b Inflight) int { return int(a.Revision) - int(b.Revision) })
	return out, nil
}

// FirstEvent returns the first event of a run (its run_created), from one
// Get, unverified and with big values left as their references;
// ErrRunNotFound when the run has none.
func (s *Store) FirstEvent(ctx context.Context, runID string) (event.Event, error) {
	if err := checkRunID(runID); err != nil {
		return event.Event{}, fmt.Errorf("reading: %w", err)
	}
	m, err := s.events.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(EventsSubject(runID)))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return event.Event{}, fmt.Errorf("reading run %s: %w", runID, ErrRunNotFound)
	}
	if err != nil {
		return event.Event{}, fmt.Errorf("reading the first event of run %s: %w", runID, err)
	}
	evs, err := event.Decode(m.Data)
	if err != nil {
		return event.Event{}, fmt.Errorf("reading the first event of run %s: %w", runID, err)
	}
	return evs[0], nil
}

// LastEvent returns the last event of a run and its head (the zero Head
// and event when it has none), from one Direct Get, unverified.
func (s *Store) LastEvent(ctx context.Context, runID string) (event.Event, Head, error) {
	if err := checkRunID(runID); err != nil {
		return event.Event{}, Head{}, fmt.Errorf("reading head: %w", err)
	}
	m, err := s.events.GetLastMsgForSubject(ctx, EventsSubject(runID))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return event.Event{}, Head{}, nil
	}
	if err != nil {
		return event.Event{}, Head{}, fmt.Errorf("reading head of run %s: %w", runID, err)
	}
	evs, err := event.Decode(m.Data)
	if err != nil {
		return event.Event{}, Head{}, fmt.Errorf("reading head of run %s: %w", runID, err)
	}
	last := evs[len(evs)-1]
	return last, Head{Seq: last.Seq, StreamSeq: m.Sequence, Hash: event.Hash(m.Data)}, nil
}
