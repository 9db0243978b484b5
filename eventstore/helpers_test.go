package eventstore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/paltest/testenv"
)

// testBundle is one test's own JetStream server with PAL's streams set up
// and a store over them.
type testBundle struct {
	srv   *testenv.NATSServer
	nc    *nats.Conn
	js    jetstream.JetStream
	cfg   eventstore.Config
	store *eventstore.Store
}

// setup starts a JetStream server for the test, runs Setup with cfg and
// opens a store with opts.
func setup(t testing.TB, cfg eventstore.Config, opts ...eventstore.Option) *testBundle {
	t.Helper()
	srv := testenv.NATS(t)
	nc := srv.Conn(t)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx := t.Context()
	require.NoError(t, eventstore.Setup(ctx, js, cfg))
	store, err := eventstore.Open(ctx, js, opts...)
	require.NoError(t, err)
	return &testBundle{srv: srv, nc: nc, js: js, cfg: cfg, store: store}
}

// openStore opens another store over the bundle's streams.
func (b *testBundle) openStore(t *testing.T, opts ...eventstore.Option) *eventstore.Store {
	t.Helper()
	s, err := eventstore.Open(t.Context(), b.js, opts...)
	require.NoError(t, err)
	return s
}

// stream returns a handle on one of PAL's streams.
func (b *testBundle) stream(t *testing.T, name string) jetstream.Stream {
	t.Helper()
	s, err := b.js.Stream(t.Context(), name)
	require.NoError(t, err)
	return s
}

// msgCount is how many messages a stream holds.
func (b *testBundle) msgCount(t *testing.T, name string) uint64 {
	t.Helper()
	info, err := b.stream(t, name).Info(t.Context())
	require.NoError(t, err)
	return info.State.Msgs
}

// lastMsg is the last message on a run's journal subject.
func (b *testBundle) lastMsg(t *testing.T, runID string) *jetstream.RawStreamMsg {
	t.Helper()
	m, err := b.stream(t, eventstore.EventsStream).GetLastMsgForSubject(t.Context(), eventstore.EventsSubject(runID))
	require.NoError(t, err)
	return m
}

// ev is an event of kind k whose data records n, so a reader can check
// which append it came from.
func ev(k event.Kind, n int) event.Event {
	return event.Event{
		Kind:     k,
		StepID:   fmt.Sprintf("step-%d", n),
		WorkerID: "w1",
		Data:     json.RawMessage(fmt.Sprintf(`{"n":%d}`, n)),
	}
}

// dataN is the n an event built by ev carries.
func dataN(t *testing.T, e event.Event) int {
	t.Helper()
	var d struct{ N int }
	require.NoError(t, e.DecodeData(&d))
	return d.N
}

// requireJournal checks that evs are exactly the events 1..n of run runID,
// gapless, each carrying its own seq as n.
func requireJournal(t *testing.T, runID string, evs []event.Event, n int) {
	t.Helper()
	require.Equal(t, n, len(evs), "events of run %s", runID)
	for i, e := range evs {
		require.Equal(t, runID, e.RunID, "event %d", i)
		require.Equal(t, uint64(i+1), e.Seq, "run %s event %d", runID, i)
		require.Equal(t, event.Version, e.V)
		require.Equal(t, i+1, dataN(t, e), "run %s seq %d carries another append's data", runID, e.Seq)
	}
}

// eventually polls cond every tick until it holds or within has passed.
func eventually(t *testing.T, within, tick time.Duration, cond func() bool, msg string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			require.FailNowf(t, "condition not met in time", msg, args...)
		}
		time.Sleep(tick)
	}
}

// timeout returns a context that ends after d (and with the test).
func timeout(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// requireHead checks a head's seq and stream sequence, and that its hash
// is the hash of the message at that stream sequence.
func requireHead(t *testing.T, seq, streamSeq uint64, h eventstore.Head) {
	t.Helper()
	require.Equal(t, seq, h.Seq, "head seq")
	require.Equal(t, streamSeq, h.StreamSeq, "head stream seq")
	require.Len(t, h.Hash, 64, "head hash")
}
