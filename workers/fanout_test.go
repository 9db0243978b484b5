package workers_test

// Steps of one run in flight at once, in an in-process worker (so the
// race detector sees the drive's goroutine and its branches).

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/provider"
	"github.com/palrun/pal/provider/providertest"
	"github.com/palrun/pal/workers"
)

// gate is a tool whose calls wait until the gate opens (or their context
// ends): it counts the calls in flight, and the most at once.
type gate struct {
	mu        sync.Mutex
	cur, most int
	arrived   chan string
	open      chan struct{}
	cancelled atomic.Int32
}

func newGate() *gate { return &gate{arrived: make(chan string, 100), open: make(chan struct{})} }

func (g *gate) tool(ctx context.Context, in json.RawMessage) (json.RawMessage, error) {
	g.mu.Lock()
	g.cur++
	g.most = max(g.most, g.cur)
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		g.cur--
		g.mu.Unlock()
	}()
	si, _ := workers.StepFromContext(ctx)
	g.arrived <- si.StepID
	select {
	case <-g.open:
		return in, nil
	case <-ctx.Done():
		g.cancelled.Add(1)
		return nil, context.Cause(ctx)
	}
}

func (g *gate) wait(t *testing.T, n int) {
	t.Helper()
	ctx := ctxFor(t, time.Minute)
	for range n {
		select {
		case <-g.arrived:
		case <-ctx.Done():
			t.Fatalf("only some of %d calls arrived", n)
		}
	}
}

func (g *gate) max() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.most
}

// toolFanOut is n tool steps t0…t(n-1) of tool from the trigger, with
// extra nodes, edges and workflow members.
func toolFanOut(n int, tool, nodes, edges, extra string) string {
	var ns, es []string
	for i := range n {
		ns = append(ns, fmt.Sprintf(`{"id":"t%d","type":"tool","data":{"tool":%q,"input":{"i":%d}}}`, i, tool, i))
		es = append(es, fmt.Sprintf(`{"from":"start","to":"t%d"}`, i))
	}
	if nodes != "" {
		ns = append(ns, nodes)
	}
	if edges != "" {
		es = append(es, edges)
	}
	return `{"name":"tools","nodes":[{"id":"start","type":"trigger"},` + strings.Join(ns, ",") + `],"edges":[` +
		strings.Join(es, ",") + `]` + extra + `}`
}

// TestRunLimitIsPolicyCappedByWorker: a run asks for six steps at once;
// a worker whose RunConcurrency is four runs four, one without a cap six.
func TestRunLimitIsPolicyCappedByWorker(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		cap, want  int
		workerOpts []paltest.WorkerOption
	}{
		{"capped", 4, 4, []paltest.WorkerOption{paltest.RunConcurrency(4)}},
		{"policy", 0, 6, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			g := newGate()
			b.Worker(t, "w1", append(tc.workerOpts, paltest.Tools(map[string]workers.Tool{"gate": g.tool}))...)
			runID := b.Start(t, toolFanOut(12, "gate", "", "", `,"policy":{"concurrency":6}`), `{}`)
			g.wait(t, tc.want)
			close(g.open)
			require.Equal(t, event.RunSucceeded, b.WaitEnd(t, runID).Kind)
			require.Equal(t, tc.want, g.max())
			require.Len(t, find(b.Events(t, runID), event.StepCompleted, ""), 12)
		})
	}
}

// TestFailureInterruptsInProcess: a tool step fails while two gated
// tools and a held webhook delivery are in flight: the tools' contexts
// are cancelled and they are journaled as interrupted; the delivery,
// claimed, is let finish and journaled as delivered; the run fails
// naming the failed step.
func TestFailureInterruptsInProcess(t *testing.T) {
	t.Parallel()
	b := setup(t)
	g := newGate()
	fire := make(chan struct{})
	fail := func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
		<-fire
		return nil, &workers.ToolError{Err: fmt.Errorf("broken")}
	}
	hook := b.Hook.Hold(nil)
	b.Worker(t, "w1", paltest.Tools(map[string]workers.Tool{"gate": g.tool, "fail": fail}))
	wf := toolFanOut(2, "gate", fmt.Sprintf(`{"id":"bad","type":"tool","data":{"tool":"fail"}},
		{"id":"notify","type":"connector","data":{"kind":"webhook","url":%q,"body":{"x":1}}}`, b.Hook.URL()),
		`{"from":"start","to":"bad"},{"from":"start","to":"notify"}`, "")
	runID := b.Start(t, wf, `{}`)
	g.wait(t, 2)
	_, err := hook.Wait(ctxFor(t, time.Minute))
	require.NoError(t, err)
	close(fire)
	hook.Release()

	end := b.WaitEnd(t, runID)
	require.Equal(t, event.RunFailed, end.Kind)
	require.Equal(t, "bad", data[event.RunFailedData](t, end).StepID)
	require.Equal(t, int32(2), g.cancelled.Load(), "both gated calls were cancelled")
	evs := b.Events(t, runID)
	for _, id := range []string{"t0", "t1"} {
		f := find(evs, event.StepFailed, id)
		require.Len(t, f, 1, id)
		require.Equal(t, event.ClassInterrupted, data[event.StepFailedData](t, f[0]).Class)
		require.Equal(t, "bad", data[event.StepFailedData](t, f[0]).InterruptedBy)
	}
	require.Len(t, find(evs, event.SideEffectDelivered, "notify"), 1, "the claimed delivery finished")
	require.Len(t, find(evs, event.StepCompleted, "notify"), 1)
	st, err := engine.Fold(evs)
	require.NoError(t, err)
	for _, s := range st.Steps {
		require.NotEqual(t, engine.StepRunning, s.Status, "%s is left half-known", s.ID)
	}
}

// TestBranchRetryWaitsInItsBranch: a branch whose first try fails waits
// out its backoff while the other branches go on.
func TestBranchRetryWaitsInItsBranch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var tries atomic.Int32
	flaky := func(context.Context, json.RawMessage) (json.RawMessage, error) {
		if tries.Add(1) == 1 {
			return nil, &workers.ToolError{Err: fmt.Errorf("not yet"), Retryable: true}
		}
		return json.RawMessage(`{"ok":true}`), nil
	}
	b.Worker(t, "w1", paltest.Tools(map[string]workers.Tool{"flaky": flaky}))
	wf := toolFanOut(3, "echo", `{"id":"f","type":"tool","data":{"tool":"flaky","retry":{"maxAttempts":2,"backoffMs":200,"retryableClasses":["tool"]}}}`,
		`{"from":"start","to":"f"}`, "")
	runID := b.Start(t, wf, `{}`)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, runID).Kind)
	evs := b.Events(t, runID)
	require.Len(t, find(evs, event.StepRetrying, "f"), 1)
	require.Len(t, find(evs, event.StepCompleted, ""), 4)
	require.Equal(t, int32(2), tries.Load())
}

// TestAgentToolCallsInProcess: a turn's three tool calls run together,
// and the next turn lists their results in the model's order.
func TestAgentToolCallsInProcess(t *testing.T) {
	t.Parallel()
	b := setup(t)
	g := newGate()
	b.LLM.SetResponder(func(c providertest.Call) providertest.Reply {
		if len(c.Messages) > 1 {
			return providertest.Reply{Text: "done"}
		}
		var calls []provider.ToolCall
		for i := range 3 {
			calls = append(calls, provider.ToolCall{ID: fmt.Sprintf("call_%d", i), Name: "gate", Arguments: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))})
		}
		return providertest.Reply{ToolCalls: calls}
	})
	b.Worker(t, "w1", paltest.Tools(map[string]workers.Tool{"gate": g.tool}))
	runID := b.Start(t, `{"name":"agent","nodes":[{"id":"start","type":"trigger"},
		{"id":"ask","type":"agent","data":{"provider":"openai","model":"m","prompt":"go","tools":[{"name":"gate"}]}}],
		"edges":[{"from":"start","to":"ask"}]}`, `{}`)
	g.wait(t, 3)
	close(g.open)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, runID).Kind)
	require.Equal(t, 3, g.max(), "the three calls overlapped")
	turn := b.LLM.CallsWithKey(key(runID, "ask.turn[1]", 1))
	require.Len(t, turn, 1)
	for j, m := range turn[0].Messages[2:] {
		require.Equal(t, fmt.Sprintf("call_%d", j), m.ToolCallID)
		require.JSONEq(t, fmt.Sprintf(`{"i":%d}`, j), m.Content)
	}
}

// TestParallelSubagentsInProcess: a loop of three subagent children with
// concurrency 3 drives the three children at once.
func TestParallelSubagentsInProcess(t *testing.T) {
	t.Parallel()
	b := setup(t)
	g := newGate()
	b.Worker(t, "w1", paltest.Tools(map[string]workers.Tool{"gate": g.tool}))
	child := `{"name":"child","nodes":[{"id":"start","type":"trigger"},{"id":"g","type":"tool","data":{"tool":"gate","input":{"n":"{{input.n}}"}}}],
		"edges":[{"from":"start","to":"g"}]}`
	runID := b.Start(t, `{"name":"kids","nodes":[{"id":"start","type":"trigger"},
		{"id":"kids","type":"loop","data":{"over":"{{input.xs}}","concurrency":3,"body":{"name":"one","nodes":[{"id":"start","type":"trigger"},
			{"id":"kid","type":"subagent","data":{"workflow":`+child+`,"input":{"n":"{{input.item}}"}}}],
			"edges":[{"from":"start","to":"kid"}]}}}],"edges":[{"from":"start","to":"kids"}]}`, `{"xs":[1,2,3]}`)
	g.wait(t, 3)
	close(g.open)
	end := b.WaitEnd(t, runID)
	require.Equal(t, event.RunSucceeded, end.Kind)
	require.Equal(t, 3, g.max(), "three children at once")
	var out engine.LoopOutput
	require.NoError(t, json.Unmarshal(data[event.RunSucceededData](t, end).Output, &out))
	for i, r := range out.Results {
		require.JSONEq(t, fmt.Sprintf(`{"n":%d}`, i+1), string(r))
	}
	require.Len(t, find(b.Events(t, runID), event.ChildRunCreated, ""), 3)
}
