package api

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/runs"
)

// TestFeeds: subscribers of one run share one watch, get every event in
// order, a subscriber that stops reading is dropped without holding up the
// others, and the feed ends after the terminal event or when its last
// subscriber leaves.
func TestFeeds(t *testing.T) {
	t.Parallel()
	pal := paltest.New(t, paltest.LeaseTTL(0))
	js, store := pal.JS, pal.Store
	ctx := context.Background()
	const runID = "run_feed"
	_, err := runs.New(store).Start(ctx, runs.StartCommand{Rights: runs.AllRights, RunID: runID,
		Workflow: json.RawMessage(`{"name":"f","nodes":[{"id":"start","type":"trigger"},{"id":"a","type":"tool","data":{"tool":"echo"}}],"edges":[{"from":"start","to":"a"}]}`)})
	require.NoError(t, err)
	head, err := store.LastHead(ctx, runID)
	require.NoError(t, err)
	appendEv := func(ev event.Event) {
		t.Helper()
		ev.WorkerID = "test"
		head, err = store.Append(ctx, runID, head, ev)
		require.NoError(t, err)
	}
	step := func(i int) {
		id := fmt.Sprintf("a%d", i)
		appendEv(event.MustNew(event.StepStarted, id, 1, event.StepStartedData{NodeID: id, NodeType: "tool",
			IdempotencyKey: event.IdempotencyKey(runID, id, 1)}))
	}

	// A drive, so its step events pass the journal check's writer rule.
	appendEv(event.MustNew(event.RunResumed, "", 0, event.RunResumedData{Worker: "test", ResumeCount: 1}))

	f := newFeeds(store, slog.New(slog.NewTextHandler(io.Discard, nil)))
	reader, leaveReader, err := f.subscribe(ctx, runID, eventstore.Head{})
	require.NoError(t, err)
	idle, leaveIdle, err := f.subscribe(ctx, runID, eventstore.Head{})
	require.NoError(t, err)
	require.Equal(t, 1, f.size(), "one feed per run")
	events, err := js.Stream(ctx, eventstore.EventsStream)
	require.NoError(t, err)
	// A watch takes no JetStream consumer (eventstore.Watch).
	info, err := events.Info(ctx)
	require.NoError(t, err)
	require.Zero(t, info.State.Consumers)

	// The reader keeps up; idle reads nothing and is dropped once it is
	// subscriptionBuffer events behind.
	n := subscriptionBuffer + 10
	got := make(chan []uint64)
	go func() {
		var seqs []uint64
		for ev := range reader.events {
			seqs = append(seqs, ev.Seq)
			if len(seqs) == n {
				break
			}
		}
		got <- seqs
	}()
	for i := range n {
		step(i)
	}
	seqs := <-got
	for i, s := range seqs {
		require.Equal(t, uint64(i+3), s, "in order, none missing")
	}
	dropped := 0
	for range idle.events {
		dropped++
	}
	require.Equal(t, subscriptionBuffer, dropped, "idle got its buffer's worth, then the channel closed")
	require.ErrorIs(t, idle.err, errLagging)
	leaveIdle() // leaving after being dropped is fine

	// A late subscriber joins the running feed.
	late, leaveLate, err := f.subscribe(ctx, runID, eventstore.Head{})
	require.NoError(t, err)
	require.Equal(t, 1, f.size())
	appendEv(event.MustNew(event.RunSucceeded, "", 0, event.RunSucceededData{Output: json.RawMessage(`{}`)}))
	for _, sub := range []*subscription{reader, late} {
		var last event.Event
		for ev := range sub.events {
			last = *ev
		}
		require.Equal(t, event.RunSucceeded, last.Kind)
		require.NoError(t, sub.err, "the terminal event ends the feed cleanly")
	}
	require.Eventually(t, func() bool { return f.size() == 0 }, 10*time.Second, time.Millisecond)
	leaveReader()
	leaveLate()

	// The last subscriber to leave stops the feed.
	other := "run_feed2"
	_, err = runs.New(store).Start(ctx, runs.StartCommand{Rights: runs.AllRights, RunID: other,
		Workflow: json.RawMessage(`{"name":"f","nodes":[{"id":"start","type":"trigger"},{"id":"a","type":"tool","data":{"tool":"echo"}}],"edges":[{"from":"start","to":"a"}]}`)})
	require.NoError(t, err)
	_, leave1, err := f.subscribe(ctx, other, eventstore.Head{})
	require.NoError(t, err)
	_, leave2, err := f.subscribe(ctx, other, eventstore.Head{})
	require.NoError(t, err)
	leave1()
	require.Equal(t, 1, f.size())
	leave2()
	require.Equal(t, 0, f.size(), "gone with its last subscriber")

	// A subscriber whose context ends while the feed starts gets its error.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, _, err = f.subscribe(cctx, other, eventstore.Head{})
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, 0, f.size())
}
