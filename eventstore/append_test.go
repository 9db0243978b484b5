package eventstore_test

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/paltest/testenv"
)

func TestAppendCreatesRun(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{})
	ctx := t.Context()
	const run = "run_create"

	created := ev(event.RunCreated, 1)
	created.V = 0
	created.Data = nil
	before := time.Now().UTC()
	evs := []event.Event{created}
	h, err := b.store.Append(ctx, run, eventstore.Head{}, evs...)
	require.NoError(t, err)
	requireHead(t, 1, 1, h)

	// Append stamps v, run_id, seq and ts, and fills empty data.
	got := evs[0]
	require.Equal(t, event.Version, got.V)
	require.Equal(t, run, got.RunID)
	require.Equal(t, uint64(1), got.Seq)
	require.False(t, got.TS.Before(before.Add(-time.Second)), "ts %v", got.TS)
	require.JSONEq(t, `{}`, string(got.Data))

	m := b.lastMsg(t, run)
	require.Equal(t, run+":1", m.Header.Get(jetstream.MsgIDHeader))
	require.Equal(t, "run_created", m.Header.Get("Pal-Kind"))
	require.Equal(t, uint64(1), m.Sequence)
	var stored event.Event
	require.NoError(t, json.Unmarshal(m.Data, &stored))
	require.Equal(t, run, stored.RunID)
	require.Equal(t, uint64(1), stored.Seq)
	require.Equal(t, "w1", stored.WorkerID)

	read, rh, err := b.store.Read(ctx, run)
	require.NoError(t, err)
	require.Equal(t, h, rh)
	require.Len(t, read, 1)
	require.Equal(t, event.RunCreated, read[0].Kind)
	require.True(t, got.TS.Equal(read[0].TS))

	// A given ts is kept.
	ts := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	next := ev(event.RunResumed, 2)
	next.TS = ts
	h, err = b.store.Append(ctx, run, h, next)
	require.NoError(t, err)
	requireHead(t, 2, 2, h)
	read, _, err = b.store.Read(ctx, run)
	require.NoError(t, err)
	require.True(t, ts.Equal(read[1].TS))
	require.Equal(t, run+":2", b.lastMsg(t, run).Header.Get(jetstream.MsgIDHeader))
}

func TestAppendNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{})
	h := eventstore.Head{Seq: 7, StreamSeq: 9}
	got, err := b.store.Append(t.Context(), "run_empty", h)
	require.NoError(t, err)
	require.Equal(t, h, got)
	require.Zero(t, b.msgCount(t, eventstore.EventsStream))
}

func TestAppendCreateTwiceConflicts(t *testing.T) {
	t.Parallel()
	for _, packed := range []bool{false, true} {
		t.Run(packName(packed), func(t *testing.T) {
			t.Parallel()
			b := setup(t, eventstore.Config{}, eventstore.WithPacking(packed))
			ctx := t.Context()
			const run = "run_twice"
			h, err := b.store.Append(ctx, run, eventstore.Head{}, ev(event.RunCreated, 1))
			require.NoError(t, err)

			// Another creator of the same run id, with its own run_created.
			other := ev(event.RunCreated, 1)
			other.WorkerID = "w2"
			other.Data = json.RawMessage(`{"n":1,"input":"other"}`)
			got, err := b.store.Append(ctx, run, eventstore.Head{}, other)
			require.Error(t, err)
			require.ErrorIs(t, err, eventstore.ErrConflict)
			var ce *eventstore.ConflictError
			require.ErrorAs(t, err, &ce)
			require.Equal(t, run, ce.RunID)
			require.Equal(t, uint64(0), ce.Expected)
			require.Equal(t, uint64(1), ce.Actual)
			require.Equal(t, eventstore.Head{}, got, "a lost append returns the head it was given")

			require.Equal(t, uint64(1), b.msgCount(t, eventstore.EventsStream))
			evs, rh, err := b.store.Read(ctx, run)
			require.NoError(t, err)
			require.Equal(t, h, rh)
			require.Len(t, evs, 1)
			require.Equal(t, "w1", evs[0].WorkerID, "the first creator's run_created stays")
		})
	}
}

// TestAppendFencesSameSeq is the zombie case of docs/architecture.md §10.2: a new owner and
// a stale writer append at the same head, so both name the same seq (and
// the same Nats-Msg-Id). Only the first lands; the other must not mistake
// it for its own append whose acknowledgement was lost.
func TestAppendFencesSameSeq(t *testing.T) {
	t.Parallel()
	for _, packed := range []bool{false, true} {
		t.Run(packName(packed), func(t *testing.T) {
			t.Parallel()
			b := setup(t, eventstore.Config{}, eventstore.WithPacking(packed))
			ctx := t.Context()
			const run = "run_zombie"
			h, err := b.store.Append(ctx, run, eventstore.Head{}, ev(event.RunCreated, 1), ev(event.RunResumed, 2))
			require.NoError(t, err)

			resumed := ev(event.RunResumed, 3)
			resumed.WorkerID = "new-owner"
			h2, err := b.store.Append(ctx, run, h, resumed)
			require.NoError(t, err)

			zombie := ev(event.StepCompleted, 3)
			zombie.WorkerID = "zombie"
			got, err := b.store.Append(ctx, run, h, zombie)
			var ce *eventstore.ConflictError
			require.ErrorAs(t, err, &ce, "a stale writer's append at a taken seq must be refused")
			require.Equal(t, eventstore.ConflictError{RunID: run, Expected: 2, Actual: 3}, *ce)
			require.Equal(t, h, got)

			evs, rh, err := b.store.Read(ctx, run)
			require.NoError(t, err)
			require.Equal(t, h2, rh)
			requireJournal(t, run, evs, 3)
			require.Equal(t, "new-owner", evs[2].WorkerID)

			// The new owner goes on from its own head.
			_, err = b.store.Append(ctx, run, h2, ev(event.StepStarted, 4))
			require.NoError(t, err)
		})
	}
}

func TestAppendStaleHeadConflicts(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{})
	ctx := t.Context()
	const run = "run_stale"
	h1, err := b.store.Append(ctx, run, eventstore.Head{}, ev(event.RunCreated, 1))
	require.NoError(t, err)
	h3, err := b.store.Append(ctx, run, h1, ev(event.RunResumed, 2), ev(event.StepStarted, 3))
	require.NoError(t, err)
	requireHead(t, 3, 3, h3)

	for _, stale := range []eventstore.Head{{}, h1, {Seq: 2, StreamSeq: 2}} {
		got, err := b.store.Append(ctx, run, stale, ev(event.StepFailed, 99), ev(event.StepFailed, 100))
		var ce *eventstore.ConflictError
		require.ErrorAs(t, err, &ce, "head %+v", stale)
		require.ErrorIs(t, err, eventstore.ErrConflict)
		require.Equal(t, run, ce.RunID)
		require.Equal(t, stale.Seq, ce.Expected)
		require.Equal(t, uint64(3), ce.Actual)
		require.Contains(t, ce.Error(), run)
		require.Equal(t, stale, got)
	}
	// A head from the future is stale too.
	_, err = b.store.Append(ctx, run, eventstore.Head{Seq: 9, StreamSeq: 9}, ev(event.StepFailed, 10))
	require.ErrorIs(t, err, eventstore.ErrConflict)

	require.Equal(t, uint64(3), b.msgCount(t, eventstore.EventsStream))
	evs, rh, err := b.store.Read(ctx, run)
	require.NoError(t, err)
	require.Equal(t, h3, rh)
	requireJournal(t, run, evs, 3)

	// A head on another run's subject does not fence this one.
	_, err = b.store.Append(ctx, "run_other", eventstore.Head{}, ev(event.RunCreated, 1))
	require.NoError(t, err)
	h4, err := b.store.Append(ctx, run, h3, ev(event.StepCompleted, 4))
	require.NoError(t, err)
	requireHead(t, 4, 5, h4)
}

// TestAppendLostAck re-sends an append that landed, as a writer does when
// the acknowledgement was lost: same head, same events. It must succeed with
// the same head and write nothing more.
func TestAppendLostAck(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		packed bool
		n      int
	}{
		{"one", false, 1},
		{"several", false, 3},
		{"packed", true, 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, eventstore.Config{}, eventstore.WithPacking(tc.packed))
			ctx := t.Context()
			const run = "run_lostack"
			h0, err := b.store.Append(ctx, run, eventstore.Head{}, ev(event.RunCreated, 1))
			require.NoError(t, err)

			evs := make([]event.Event, tc.n)
			for i := range evs {
				evs[i] = ev(event.ApprovalReceived, i+2)
			}
			h, err := b.store.Append(ctx, run, h0, evs...)
			require.NoError(t, err)
			count := b.msgCount(t, eventstore.EventsStream)

			again, err := b.store.Append(ctx, run, h0, evs...)
			require.NoError(t, err, "re-sending an append that landed")
			require.Equal(t, h, again)
			require.Equal(t, count, b.msgCount(t, eventstore.EventsStream), "the re-sent append wrote a message")

			read, rh, err := b.store.Read(ctx, run)
			require.NoError(t, err)
			require.Equal(t, h, rh)
			requireJournal(t, run, read, tc.n+1)

			// Once someone appended after it, the same re-send is a conflict.
			h2, err := b.store.Append(ctx, run, h, ev(event.ApprovalReceived, tc.n+2))
			require.NoError(t, err)
			_, err = b.store.Append(ctx, run, h0, evs...)
			if err == nil {
				// Recognising the landed append is also correct; it must
				// not have written anything.
				require.Equal(t, count+1, b.msgCount(t, eventstore.EventsStream))
			} else {
				require.ErrorIs(t, err, eventstore.ErrConflict)
			}
			_, rh, err = b.store.Read(ctx, run)
			require.NoError(t, err)
			require.Equal(t, h2, rh)
		})
	}
}

func TestAppendPacked(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{}, eventstore.WithPacking(true))
	ctx := t.Context()
	const run = "run_packed"

	h, err := b.store.Append(ctx, run, eventstore.Head{}, ev(event.RunCreated, 1))
	require.NoError(t, err)
	requireHead(t, 1, 1, h)
	one := b.lastMsg(t, run)
	require.Equal(t, byte('{'), one.Data[0], "a single event is an object even when packing")

	h, err = b.store.Append(ctx, run, h, ev(event.RunResumed, 2), ev(event.StepStarted, 3), ev(event.StepCompleted, 4))
	require.NoError(t, err)
	requireHead(t, 4, 2, h)
	require.Equal(t, uint64(2), b.msgCount(t, eventstore.EventsStream))

	m := b.lastMsg(t, run)
	require.Equal(t, run+":2", m.Header.Get(jetstream.MsgIDHeader), "a packed message is named by its first seq")
	require.Equal(t, "run_resumed,step_started,step_completed", m.Header.Get("Pal-Kind"))
	var arr []event.Event
	require.NoError(t, json.Unmarshal(m.Data, &arr), "a packed message is a JSON array")
	require.Len(t, arr, 3)

	evs, rh, err := b.store.Read(ctx, run)
	require.NoError(t, err)
	require.Equal(t, h, rh)
	requireJournal(t, run, evs, 4)
	require.Equal(t, []event.Kind{event.RunCreated, event.RunResumed, event.StepStarted, event.StepCompleted},
		[]event.Kind{evs[0].Kind, evs[1].Kind, evs[2].Kind, evs[3].Kind})

	// An unpacked store appends to the same run one message per event.
	plain := b.openStore(t)
	h, err = plain.Append(ctx, run, h, ev(event.StepStarted, 5), ev(event.StepCompleted, 6))
	require.NoError(t, err)
	requireHead(t, 6, 4, h)
	require.Equal(t, uint64(4), b.msgCount(t, eventstore.EventsStream))
	evs, _, err = b.store.Read(ctx, run)
	require.NoError(t, err)
	requireJournal(t, run, evs, 6)
}

func TestAppendTooLarge(t *testing.T) {
	t.Parallel()
	const limit = 4096
	// step_failed has no field kept as a blob (§6.4): a big error stays
	// inline and is refused.
	big := func(n int) event.Event {
		e := ev(event.StepFailed, n)
		e.Data = json.RawMessage(`{"n":` + itoa(n) + `,"error":"` + strings.Repeat("x", 2*limit) + `"}`)
		return e
	}
	cases := []struct {
		name   string
		packed bool
		evs    func() []event.Event
	}{
		{"one", false, func() []event.Event { return []event.Event{big(2)} }},
		{"last of several", false, func() []event.Event { return []event.Event{ev(event.StepStarted, 2), ev(event.StepStarted, 3), big(4)} }},
		{"packed", true, func() []event.Event { return []event.Event{ev(event.StepStarted, 2), big(3)} }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, eventstore.Config{MaxEventBytes: limit}, eventstore.WithPacking(tc.packed))
			ctx := t.Context()
			const run = "run_big"
			h, err := b.store.Append(ctx, run, eventstore.Head{}, ev(event.RunCreated, 1))
			require.NoError(t, err)

			got, err := b.store.Append(ctx, run, h, tc.evs()...)
			require.ErrorIs(t, err, eventstore.ErrPayloadTooLarge)
			require.Contains(t, err.Error(), run)
			require.Equal(t, h, got)
			require.Equal(t, uint64(1), b.msgCount(t, eventstore.EventsStream), "a refused append must write nothing")
			_, rh, err := b.store.Read(ctx, run)
			require.NoError(t, err)
			require.Equal(t, h, rh)

			// The run goes on.
			_, err = b.store.Append(ctx, run, h, ev(event.StepStarted, 2))
			require.NoError(t, err)
		})
	}
}

// TestAppendTooLargeByServer lowers the stream's limit after the store was
// opened, so only the server can refuse the message.
func TestAppendTooLargeByServer(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{})
	ctx := t.Context()
	const run = "run_big"
	h, err := b.store.Append(ctx, run, eventstore.Head{}, ev(event.RunCreated, 1))
	require.NoError(t, err)
	require.NoError(t, eventstore.Setup(ctx, b.js, eventstore.Config{MaxEventBytes: 1024}))

	e := ev(event.StepCompleted, 2)
	e.Data = json.RawMessage(`{"n":2,"output":"` + strings.Repeat("y", 4096) + `"}`)
	got, err := b.store.Append(timeout(t, 10*time.Second), run, h, e)
	require.ErrorIs(t, err, eventstore.ErrPayloadTooLarge)
	require.False(t, errors.Is(err, eventstore.ErrConflict))
	require.Equal(t, h, got)
	require.Equal(t, uint64(1), b.msgCount(t, eventstore.EventsStream))
}

func TestAppendCanceled(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := b.store.Append(ctx, "run_cancel", eventstore.Head{}, ev(event.RunCreated, 1))
	require.ErrorIs(t, err, context.Canceled)
	require.Zero(t, b.msgCount(t, eventstore.EventsStream))
}

func packName(packed bool) string {
	if packed {
		return "packed"
	}
	return "unpacked"
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestAppendStrict runs the journal on a server that fsyncs every write
// (PAL_DURABILITY=strict) and restarts it: everything acknowledged is
// there.
func TestAppendStrict(t *testing.T) {
	t.Parallel()
	srv := testenv.NATS(t, testenv.Strict())
	require.True(t, srv.Server().JetStreamConfig().SyncAlways)
	js, err := jetstream.New(srv.Conn(t))
	require.NoError(t, err)
	ctx := timeout(t, 30*time.Second)
	require.NoError(t, eventstore.Setup(ctx, js, eventstore.Config{}))
	s, err := eventstore.Open(ctx, js, eventstore.WithPacking(true))
	require.NoError(t, err)

	const run = "run_strict"
	h := eventstore.Head{}
	for n := 1; n <= 30; n += 3 {
		h, err = s.Append(ctx, run, h, ev(event.ApprovalReceived, n), ev(event.ApprovalReceived, n+1), ev(event.ApprovalReceived, n+2))
		require.NoError(t, err)
	}
	srv.Restart(t)
	evs, rh, err := s.Read(ctx, run)
	require.NoError(t, err)
	requireJournal(t, run, evs, 30)
	require.Equal(t, h, rh)
}
