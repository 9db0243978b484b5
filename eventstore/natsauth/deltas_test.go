package natsauth_test

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
	"github.com/palrun/pal/eventstore/natsauth"
	"github.com/palrun/pal/paltest/testenv"
)

// TestDeltasUnderRoles: LLM steps' text crosses to the client account as
// the worker publishes it (pal.deltas.<run_id>, a stream import), a
// client user reads what PAL_DELTAS keeps (Direct Get, batched as
// WatchDeltas reads it, through the links), the api role watches it
// (WatchDeltas), and no client may publish a delta. PAL's roles hit no
// violation.
func TestDeltasUnderRoles(t *testing.T) {
	srv := testenv.NATS(t, testenv.Roles())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	palViol, cviol := newViolations(), newViolations()
	open := func(role natsauth.Role) *eventstore.Store {
		js, err := jetstream.New(srv.ConnAs(t, role, palViol.option()))
		require.NoError(t, err)
		if role == natsauth.Worker {
			require.NoError(t, eventstore.Setup(ctx, js, eventstore.Config{}))
		}
		st, err := eventstore.Open(ctx, js)
		require.NoError(t, err)
		return st
	}
	worker := open(natsauth.Worker)
	apiStore := open(natsauth.API)
	client := srv.ConnAs(t, natsauth.Client, cviol.option())

	runID := event.NewRunID()
	subj := eventstore.DeltaSubject(runID)
	live, err := client.SubscribeSync(subj)
	require.NoError(t, err)
	require.NoError(t, client.Flush())
	delta := func(i int) event.Delta {
		return event.Delta{StepID: "ask", Attempt: 1, Call: 3, Index: i, Text: fmt.Sprintf("w%d ", i), Kind: event.DeltaText, Reset: i == 0}
	}
	for i := range 3 {
		require.NoError(t, worker.PublishDelta(runID, delta(i)))
	}
	for i := range 3 {
		m, err := live.NextMsg(10 * time.Second)
		require.NoError(t, err, "delta %d did not cross to the client account", i)
		var d event.Delta
		require.NoError(t, json.Unmarshal(m.Data, &d))
		require.Equal(t, delta(i), d)
	}

	// The text so far, as a watch that begins mid-step reads it.
	require.Eventually(t, func() bool {
		info, err := worker.JetStream().Stream(ctx, eventstore.DeltasStream)
		return err == nil && info.CachedInfo().State.Msgs == 3
	}, 10*time.Second, 5*time.Millisecond)
	inbox := client.NewRespInbox()
	stored, err := client.SubscribeSync(inbox)
	require.NoError(t, err)
	body := fmt.Appendf(nil, `{"seq":1,"next_by_subj":%q,"batch":10}`, subj)
	require.NoError(t, client.PublishMsg(&nats.Msg{Subject: "$JS.API.DIRECT.GET." + eventstore.DeltasStream, Reply: inbox, Data: body}))
	var texts []string
	for {
		m, err := stored.NextMsg(10 * time.Second)
		require.NoError(t, err)
		if m.Header.Get("Status") == "204" { // the end of the batch
			break
		}
		var d event.Delta
		require.NoError(t, json.Unmarshal(m.Data, &d))
		texts = append(texts, d.Text)
	}
	require.Equal(t, []string{"w0 ", "w1 ", "w2 "}, texts)

	// The api role's watch (the feeds with deltas): the stored text, then
	// a live delta.
	got := make(chan event.Delta, 8)
	done := make(chan error, 1)
	go func() {
		done <- apiStore.WatchDeltas(ctx, runID, func(d event.Delta) error {
			got <- d
			if d.Index == 3 {
				return eventstore.ErrStopWatch
			}
			return nil
		})
	}()
	for i := range 3 {
		require.Equal(t, delta(i), <-got)
	}
	require.NoError(t, worker.PublishDelta(runID, delta(3)))
	require.Equal(t, delta(3), <-got)
	require.NoError(t, <-done)
	// A delta is a core publish: the watch can take it live before
	// PAL_DELTAS has stored it.
	require.Eventually(t, func() bool {
		info, err := worker.JetStream().Stream(ctx, eventstore.DeltasStream)
		return err == nil && info.CachedInfo().State.Msgs == 4
	}, 10*time.Second, 5*time.Millisecond, "PAL_DELTAS stored the fourth delta")

	// A client cannot publish a delta: not live, not into PAL_DELTAS.
	require.NoError(t, client.Publish(subj, []byte(`{"step_id":"ask","call":99,"index":0,"text":"forged","reset":true}`)))
	require.NoError(t, client.Flush())
	cviol.wait(t, subj)
	info, err := worker.JetStream().Stream(ctx, eventstore.DeltasStream)
	require.NoError(t, err)
	require.Equal(t, uint64(4), info.CachedInfo().State.Msgs, "the forged delta was not stored")
	require.Empty(t, palViol.all(), "PAL's roles hit a permissions violation")
}
