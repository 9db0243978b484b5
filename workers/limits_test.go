package workers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/paltest/testenv"
	"github.com/palrun/pal/runs"
	"github.com/palrun/pal/workers"
)

func TestOversizedOutputFailsTheStepOnce(t *testing.T) {
	t.Parallel()
	// A 64 MiB value under the race detector can starve the lease keeper
	// of a 1 s lease; a lost lease would run the step again.
	// The value is built once, before the run: marshalling 64 MiB inside
	// the tool took seconds under the race detector on a loaded machine.
	b := setup(t, paltest.LeaseTTL(5*time.Second))
	big := json.RawMessage(`"` + strings.Repeat("x", event.MaxBlobBytes) + `"`)
	var calls atomic.Int32
	b.worker(t, "w1", map[string]workers.Tool{"big": func(context.Context, json.RawMessage) (json.RawMessage, error) {
		calls.Add(1)
		return big, nil
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
	require.NoError(t, b.Store.Enqueue(context.Background(), "", runID, "test"))
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
	require.NoError(t, b.Store.Enqueue(ctx, "", runID, "test"))
	b.worker(t, "w1", nil)
	final := b.WaitEnd(t, runID)
	require.Equal(t, event.RunFailed, final.Kind)
	fd := data[event.RunFailedData](t, final)
	require.Equal(t, event.CodeInternal, fd.Code)
	require.Contains(t, fd.Error, "do not match its hash")
	require.Empty(t, find(testenv.ReadJournal(t, b.NC)[runID], event.StepStarted, "t2"), "nothing ran on the forged value")
	b.settled(t, runID)
}

// TestBigRunInputAndForkCopies: a run's big input and a fork's big copied
// output are kept in PAL_BLOBS like step values; the runs read them back,
// and the fork does not run the copied step again.
func TestBigRunInputAndForkCopies(t *testing.T) {
	t.Parallel()
	b := setup(t, paltest.LeaseTTL(5*time.Second)) // as TestOversizedOutputFailsTheStepOnce
	ctx := context.Background()
	var calls atomic.Int32
	big := strings.Repeat("q", 2*eventstore.DefaultBlobThreshold)
	b.worker(t, "w1", map[string]workers.Tool{"big": func(_ context.Context, in json.RawMessage) (json.RawMessage, error) {
		calls.Add(1)
		return in, nil
	}})
	wf := `{"name":"fork-big","nodes":[{"id":"start","type":"trigger"},
		{"id":"b","type":"tool","data":{"tool":"big","input":{"v":"{{input.v}}"}}},
		{"id":"e","type":"tool","data":{"tool":"echo","input":{"n":1}}}],
		"edges":[{"from":"start","to":"b"},{"from":"b","to":"e"}]}`
	src := b.Start(t, wf, `{"v":"`+big+`"}`)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, src).Kind)
	created := testenv.ReadJournal(t, b.NC)[src][0]
	refs, err := event.Blobs(created)
	require.NoError(t, err)
	require.Len(t, refs, 1, "the run's input is a blob")
	srcOut := data[event.StepCompletedData](t, find(b.Events(t, src), event.StepCompleted, "b")[0]).Output
	require.Contains(t, string(srcOut), big)

	res, err := runs.New(b.Store).Fork(ctx, runs.ForkCommand{Rights: runs.AllRights, RunID: src, From: "e", By: "test"})
	require.NoError(t, err)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, res.RunID).Kind)
	require.Equal(t, int32(1), calls.Load(), "the copied step did not run again")
	refs, err = event.Blobs(testenv.ReadJournal(t, b.NC)[res.RunID][0])
	require.NoError(t, err)
	var where []string
	for _, r := range refs {
		where = append(where, r.Field)
	}
	require.Equal(t, []string{"input", "forked_from.copies[0].output"}, where)
	got := data[event.StepCompletedData](t, find(b.Events(t, res.RunID), event.StepCompleted, "b")[0])
	require.Equal(t, string(srcOut), string(got.Output))
	require.NotNil(t, got.CopiedFrom)
}
