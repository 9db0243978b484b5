package workers_test

// Operating runs with real processes: signals that survive kill -9 of
// every process, a forced resume that takes a run from a frozen worker,
// and forks that copy what came before the fork step.

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/paltest/testenv"
	"github.com/palrun/pal/provider/providertest"
	"github.com/palrun/pal/runs"
)

// waitSignalWorkflow waits for signal "go" and echoes what it carried.
const waitSignalWorkflow = `{"name":"wait-go","nodes":[{"id":"start","type":"trigger"},
	{"id":"hold","type":"wait","data":{"signal":"go"}},
	{"id":"after","type":"tool","data":{"tool":"echo","input":{"got":"{{steps.hold.output.n}}"}}}],
	"edges":[{"from":"start","to":"hold"},{"from":"hold","to":"after"}]}`

// waitForKind polls a run's journal (through server restarts) until its
// last event is of kind k.
func waitForKind(t *testing.T, ctx context.Context, store *eventstore.Store, runID string, k event.Kind) []event.Event {
	t.Helper()
	for {
		evs, _, err := store.Read(ctx, runID)
		if err == nil && len(evs) > 0 && evs[len(evs)-1].Kind == k {
			return evs
		}
		select {
		case <-ctx.Done():
			t.Fatalf("run %s: no %s: %v", runID, k, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// signalTaken checks that run's journal holds one signal_received and
// that the wait step took exactly it, once.
func signalTaken(t *testing.T, evs []event.Event, n int) {
	t.Helper()
	sent := find(evs, event.SignalReceived, "")
	require.Len(t, sent, 1)
	done := find(evs, event.StepCompleted, "hold")
	require.Len(t, done, 1)
	require.Equal(t, sent[0].Seq, data[event.StepCompletedData](t, done[0]).SignalSeq)
	require.JSONEq(t, fmt.Sprintf(`{"n":%d}`, n), string(data[event.StepCompletedData](t, done[0]).Output))
	after := data[event.StepCompletedData](t, find(evs, event.StepCompleted, "after")[0])
	require.JSONEq(t, fmt.Sprintf(`{"got":%d}`, n), string(after.Output))
}

func TestSignalsSurviveKill9OfEveryProcess(t *testing.T) {
	t.Parallel()
	nproc := testenv.NATSProcess(t)
	nc := nproc.Conn(t)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx := ctxFor(t, 3*time.Minute)
	require.NoError(t, eventstore.Setup(ctx, js, eventstore.Config{LeaseTTL: time.Second}))
	store, err := eventstore.Open(ctx, js)
	require.NoError(t, err)
	client := runs.New(store)
	env := []string{"PAL_NATS_URL=" + nproc.URL(), "PAL_WORKER_ID=w1", "PAL_LEASE_TTL=1s", "PAL_LOG_LEVEL=debug"}

	// Run early gets its signal before any worker has driven it.
	early, err := client.Start(ctx, runs.StartCommand{Rights: runs.AllRights, Workflow: json.RawMessage(waitSignalWorkflow)})
	require.NoError(t, err)
	require.NoError(t, client.Signal(ctx, runs.SignalCommand{RunID: early.RunID, Signal: "go", Payload: json.RawMessage(`{"n":1}`), By: "ops"}))
	late, err := client.Start(ctx, runs.StartCommand{Rights: runs.AllRights, Workflow: json.RawMessage(waitSignalWorkflow)})
	require.NoError(t, err)

	w := testenv.StartProcess(t, testenv.PalBinary(t), []string{"worker"}, env)
	require.NoError(t, w.WaitForOutput(ctx, "worker ready"))
	signalTaken(t, waitEndOn(t, ctx, store, early.RunID), 1)
	waitForKind(t, ctx, store, late.RunID, event.StepWaiting) // parked on hold

	// kill -9 the worker and the NATS server, start both again.
	w.Kill()
	nproc.Kill()
	nproc.Start(t)
	w2 := testenv.StartProcess(t, testenv.PalBinary(t), []string{"worker"}, append(env[:1:1], "PAL_WORKER_ID=w2", "PAL_LEASE_TTL=1s"))
	require.NoError(t, w2.WaitForOutput(ctx, "worker ready"))
	require.Eventually(t, func() bool {
		return client.Signal(ctx, runs.SignalCommand{RunID: late.RunID, Signal: "go", Payload: json.RawMessage(`{"n":2}`), By: "ops"}) == nil
	}, time.Minute, 100*time.Millisecond, "signalling after the restart")
	evs := waitEndOn(t, ctx, store, late.RunID)
	require.Equal(t, event.RunSucceeded, evs[len(evs)-1].Kind, w2.Output())
	signalTaken(t, evs, 2)

	// A signal no wait node takes any more is refused: nothing is written.
	err = client.Signal(ctx, runs.SignalCommand{RunID: late.RunID, Signal: "go"})
	require.ErrorIs(t, err, runs.ErrRunFinished)
	j := testenv.ReadJournal(t, nc)
	require.Len(t, j[late.RunID], len(evs))
}

func TestForcedResumeTakesARunFromAFrozenWorker(t *testing.T) {
	t.Parallel()
	// A 30 s lease: only the resume can move the run on before it expires.
	p := setupProc(t, 30*time.Second)
	runID := event.NewRunID()
	s3 := key(runID, "s3", 1)
	hold := p.LLM.Hold(providertest.ByKey(s3))
	w1 := p.palWorker(t, "w1")
	_, err := runs.New(p.Store).Start(context.Background(), runs.StartCommand{Rights: runs.AllRights,
		RunID: runID, Workflow: json.RawMessage(seqWorkflow(4, "openai")), Input: json.RawMessage(`{"topic":"resume"}`)})
	require.NoError(t, err)
	_, err = hold.Wait(ctxFor(t, 30*time.Second))
	require.NoError(t, err, w1.Output())
	require.NoError(t, w1.Stop()) // SIGSTOP, holding a live lease
	p.palWorker(t, "w2")

	dir := t.TempDir()
	cli := func(args ...string) (*testenv.Process, error) {
		proc := testenv.StartProcess(t, p.bin, append([]string{"run"}, args...), []string{"PAL_NATS_URL=" + p.natsURL, "PAL_DATA_DIR=" + dir})
		return proc, proc.Wait(ctxFor(t, 30*time.Second))
	}
	// A plain resume is refused: w1 holds the lease.
	proc, err := cli("resume", runID)
	require.Error(t, err)
	require.Contains(t, proc.Output(), "held by w1")
	require.Contains(t, proc.Output(), "--force")

	sent := time.Now()
	proc, err = cli("resume", runID, "--force")
	require.NoError(t, err, proc.Output())
	require.Contains(t, proc.Output(), "took run "+runID+" from w1")
	require.Contains(t, proc.Output(), "; w2/")
	_, err = hold.Wait(ctxFor(t, 30*time.Second)) // w2 re-sends s3, same key
	require.NoError(t, err)
	took := time.Since(sent)
	t.Logf("forced resume to w2's call: %v", took)
	// The property, not a speed: w2 drove the run while w1's 30 s lease
	// still held, which only the forced resume allows.
	require.Less(t, took, 15*time.Second, "w2 drives the run long before w1's lease would have expired")
	hold.Release()
	require.Equal(t, event.RunSucceeded, p.WaitEnd(t, runID).Kind)
	before := p.Events(t, runID)

	require.NoError(t, w1.Cont())
	// Its drive ends one way or the other: fenced out, its lease lost, or
	// the run found ended.
	require.NoError(t, w1.WaitForOutput(ctxFor(t, 30*time.Second), "outcome="), w1.Output())
	require.Equal(t, before, p.Events(t, runID), "the frozen worker appended after the resume")
	rs := resumesOf(t, before)
	require.Len(t, rs, 2)
	require.Equal(t, "w2", rs[1].Worker)

	// An ended run is refused, pointing to retry and fork.
	proc, err = cli("resume", runID)
	require.Error(t, err)
	require.Contains(t, proc.Output(), "pal run retry")
}

func TestForkCopiesStepsBeforeTheForkStep(t *testing.T) {
	t.Parallel()
	p := setupProc(t, time.Second)
	p.palWorker(t, "w1")
	client := runs.New(p.Store)
	ctx := ctxFor(t, 2*time.Minute)
	wf := seqWorkflow(6, "openai")
	src, err := client.Start(ctx, runs.StartCommand{Rights: runs.AllRights, Workflow: json.RawMessage(wf), Input: json.RawMessage(`{"topic":"fork"}`)})
	require.NoError(t, err)
	require.Equal(t, event.RunSucceeded, p.WaitEnd(t, src.RunID).Kind)

	steps := []string{"s1", "s2", "s3", "s4", "s5", "s6"}
	check := func(res runs.ForkResult, copied []string) {
		t.Helper()
		require.Equal(t, event.RunSucceeded, p.WaitEnd(t, res.RunID).Kind)
		evs := p.Events(t, res.RunID)
		created := data[event.RunCreatedData](t, evs[0])
		require.Equal(t, src.RunID, created.ForkedFrom.RunID)
		require.Equal(t, "s4", created.ForkedFrom.StepID)
		keys := p.LLM.Keys()
		for _, s := range steps {
			done := find(evs, event.StepCompleted, s)
			require.Len(t, done, 1, s)
			cf := data[event.StepCompletedData](t, done[0]).CopiedFrom
			if contains(copied, s) {
				require.NotNil(t, cf, s)
				require.Equal(t, src.RunID, cf.RunID)
				require.Zero(t, keys[key(res.RunID, s, 1)], "copied step %s called the provider", s)
			} else {
				require.Nil(t, cf, s)
				require.Equal(t, 1, keys[key(res.RunID, s, 1)], "step %s runs once, under the fork's key", s)
			}
			require.Equal(t, 1, keys[key(src.RunID, s, 1)], "the source's calls are its own")
		}
	}

	res, err := client.Fork(ctx, runs.ForkCommand{Rights: runs.AllRights, RunID: src.RunID, From: "s4"})
	require.NoError(t, err)
	require.Equal(t, []string{"s1", "s2", "s3"}, res.Copied)
	check(res, []string{"s1", "s2", "s3"})

	// A changed prompt on s2: s2 and everything after it runs again.
	changed := strings.Replace(wf, "step 2 after", "step two after", 1)
	require.NotEqual(t, wf, changed)
	res, err = client.Fork(ctx, runs.ForkCommand{Rights: runs.AllRights, RunID: src.RunID, From: "s4", Workflow: json.RawMessage(changed)})
	require.NoError(t, err)
	require.Equal(t, []string{"s1"}, res.Copied)
	require.Len(t, res.Rerun, 2)
	require.Equal(t, "s2", res.Rerun[0].StepID)
	require.Contains(t, res.Rerun[0].Reason, "node s2 changed")
	require.Equal(t, "s3", res.Rerun[1].StepID)
	require.Contains(t, res.Rerun[1].Reason, "after step s2")
	check(res, []string{"s1"})

	// A step the source never ran cannot be forked from.
	_, err = client.Fork(ctx, runs.ForkCommand{Rights: runs.AllRights, RunID: src.RunID, From: "s9"})
	var ie *runs.InputError
	require.ErrorAs(t, err, &ie)
	require.Equal(t, "from", ie.Field)
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}
