package workers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/internal/testenv"
	"github.com/palrun/pal/workers"
)

func TestOversizedOutputFailsTheStepOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var calls atomic.Int32
	b.worker(t, "w1", map[string]workers.Tool{"big": func(context.Context, json.RawMessage) (json.RawMessage, error) {
		calls.Add(1)
		return json.Marshal(strings.Repeat("x", event.MaxBlobBytes))
	}})
	wf := `{"name":"big","nodes":[{"id":"start","type":"trigger"},
		{"id":"b","type":"tool","data":{"tool":"big","retry":{"maxAttempts":3,"retryableClasses":["any"]}}}],
		"edges":[{"from":"start","to":"b"}]}`
	runID := b.Start(t, wf, `{}`)
	final := b.WaitEnd(t, runID)
	require.Equal(t, event.RunFailed, final.Kind)
	require.Contains(t, data[event.RunFailedData](t, final).Error, fmt.Sprintf("its output is %d bytes; a step value is at most %d bytes", event.MaxBlobBytes+2, event.MaxBlobBytes))
	require.Equal(t, int32(1), calls.Load(), "a step whose output cannot be journaled is not run again")
}

func TestJournalThatDoesNotFoldEndsTheRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runID := createOrphan(t, b, echoChain(2))
	// A second run_created: the fold refuses such a journal.
	ev := event.MustNew(event.RunCreated, "", 0, event.RunCreatedData{Workflow: json.RawMessage(echoChain(1)), Input: json.RawMessage(`{}`)})
	appendRaw(t, b, runID, ev)
	require.NoError(t, b.Store.Enqueue(context.Background(), runID, "test"))
	b.worker(t, "w1", nil)
	final := b.WaitEnd(t, runID)
	require.Equal(t, event.RunFailed, final.Kind)
	fd := data[event.RunFailedData](t, final)
	require.Equal(t, event.CodeInternal, fd.Code)
	require.Contains(t, fd.Error, "the journal does not fold")
	b.settled(t, runID)
}

// TestForgedBlobEndsTheRun: a journal whose step_completed names a blob
// whose stored bytes are not what its hash says cannot be driven; the
// worker fails the run instead of folding the forged value.
func TestForgedBlobEndsTheRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	runID := createOrphan(t, b, echoChain(2))
	real, forged := []byte(`{"i":1}`), []byte(`{"i":9}`)
	obs, err := b.JS.ObjectStore(ctx, eventstore.BlobBucket)
	require.NoError(t, err)
	_, err = obs.PutBytes(ctx, event.BlobSum(real), forged)
	require.NoError(t, err)
	key := event.IdempotencyKey(runID, "t1", 1)
	appendRaw(t, b, runID,
		event.MustNew(event.RunResumed, "", 0, event.RunResumedData{Worker: "crashed-worker", ResumeCount: 1}),
		event.MustNew(event.StepStarted, "t1", 1, event.StepStartedData{NodeID: "t1", NodeType: "tool", Input: json.RawMessage(`{"tool":"echo","input":{"i":1}}`), IdempotencyKey: key}),
		event.Event{V: event.Version, Kind: event.StepCompleted, StepID: "t1", Attempt: 1,
			Data: fmt.Appendf(nil, `{"duration_ms":1,"output_blob":{"blob":%q,"size":%d}}`, event.BlobSum(real), len(real))})
	require.NoError(t, b.Store.Enqueue(ctx, runID, "test"))
	b.worker(t, "w1", nil)
	final := b.WaitEnd(t, runID)
	require.Equal(t, event.RunFailed, final.Kind)
	fd := data[event.RunFailedData](t, final)
	require.Equal(t, event.CodeInternal, fd.Code)
	require.Contains(t, fd.Error, "do not match its hash")
	require.Empty(t, find(testenv.ReadJournal(t, b.NC)[runID], event.StepStarted, "t2"), "nothing ran on the forged value")
	b.settled(t, runID)
}
