package runs_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/provider/providertest"
	"github.com/palrun/pal/runs"
)

func TestCancelStopsTheInFlightCallAndEndsTheRunOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, paltest.LeaseTTL(30*time.Second))
	hold := b.LLM.Hold(func(c providertest.Call) bool { return strings.Contains(c.LastUser(), "step 2") })
	logs := b.captureLogs(t)
	b.worker(t, "w1", nil)
	runID := b.Start(t, seqWorkflow(3, "openai"), `{"topic":"cancel"}`)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := hold.Wait(ctx)
	require.NoError(t, err)

	require.NoError(t, runs.New(b.Store, runs.WithConn(b.NC)).Cancel(ctx, runs.CancelCommand{RunID: runID, Reason: "changed my mind", By: "alice"}))
	// The driving worker drops the call and lets go of the run without
	// waiting for its 30 s lease or the held call.
	logs.Wait(t, "run ended by another writer")
	require.Eventually(t, func() bool {
		h, err := b.Leases.Holder(ctx, runID)
		p, perr := b.Store.WorkPending(ctx, "", runID)
		return err == nil && perr == nil && h == "" && !p
	}, 10*time.Second, 10*time.Millisecond, "lease released and work acked")
	hold.Release()

	evs := b.Events(t, runID)
	last := evs[len(evs)-1]
	require.Equal(t, event.RunCancelled, last.Kind)
	require.Equal(t, "alice", last.WorkerID)
	require.Equal(t, "changed my mind", data[event.RunCancelledData](t, last).Reason)
	require.Empty(t, find(evs, event.StepCompleted, "s2"))

	// Cancelling again, or a finished run, writes nothing.
	err = runs.New(b.Store, runs.WithConn(b.NC)).Cancel(ctx, runs.CancelCommand{RunID: runID})
	require.ErrorIs(t, err, runs.ErrRunFinished)
	require.Len(t, b.Events(t, runID), len(evs))

	err = runs.New(b.Store, runs.WithConn(b.NC)).Cancel(ctx, runs.CancelCommand{RunID: "run_nope"})
	require.ErrorIs(t, err, eventstore.ErrRunNotFound)
	var ie *runs.InputError
	require.ErrorAs(t, runs.New(b.Store, runs.WithConn(b.NC)).Cancel(ctx, runs.CancelCommand{RunID: "a.b"}), &ie)
}

func TestCancelQueuedRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	runID := createOrphan(t, b, echoChain(2))
	require.NoError(t, runs.New(b.Store, runs.WithConn(b.NC)).Cancel(ctx, runs.CancelCommand{RunID: runID}))
	require.NoError(t, b.Store.Enqueue(ctx, "", runID, "test"))
	b.worker(t, "w1", nil)
	require.Eventually(t, func() bool {
		p, err := b.Store.WorkPending(ctx, "", runID)
		return err == nil && !p
	}, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, []event.Kind{event.RunCreated, event.RunCancelled}, kindsOf(b.Events(t, runID)))
}

func kindsOf(evs []event.Event) []event.Kind {
	var out []event.Kind
	for _, ev := range evs {
		out = append(out, ev.Kind)
	}
	return out
}
