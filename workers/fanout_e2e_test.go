package workers_test

// Steps of one run in flight at once, driven by real `pal worker`
// processes: a fan-out and its join, a budget over a fan-out, a failed
// branch and the siblings it interrupts, and an agent turn's tool calls.

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/connector/connectortest"
	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/provider"
	"github.com/palrun/pal/provider/providertest"
	"github.com/palrun/pal/workflow"
)

// fanOutWorkflow is n ai-steps b0…b(n-1) from the trigger, each with
// maxTokens 50, joined by one that reads them all when join is set;
// extra is added to the workflow object (a policy).
func fanOutWorkflow(n int, join bool, extra string) string {
	nodes := []string{`{"id":"start","type":"trigger"}`}
	var edges, refs []string
	for i := range n {
		id := fmt.Sprintf("b%d", i)
		nodes = append(nodes, fmt.Sprintf(`{"id":%q,"type":"ai-step","data":{"provider":"openai","model":"gpt-4o-mini",`+
			`"maxTokens":50,"prompt":"branch %02d of {{input.topic}}"}}`, id, i))
		edges = append(edges, fmt.Sprintf(`{"from":"start","to":%q}`, id))
		refs = append(refs, fmt.Sprintf("{{steps.%s.output.text}}", id))
	}
	if join {
		nodes = append(nodes, `{"id":"join","type":"ai-step","data":{"provider":"openai","model":"gpt-4o-mini",`+
			`"prompt":"Join: `+strings.Join(refs, " | ")+`"}}`)
		for i := range n {
			edges = append(edges, fmt.Sprintf(`{"from":"b%d","to":"join"}`, i))
		}
	}
	if extra != "" {
		extra = "," + extra
	}
	return `{"name":"fan-out","nodes":[` + strings.Join(nodes, ",") + `],"edges":[` + strings.Join(edges, ",") + `]` + extra + `}`
}

// keysOf are the idempotency keys of the first attempts of steps of run.
func keysOf(runID string, steps ...string) map[string]bool {
	m := map[string]bool{}
	for _, s := range steps {
		m[key(runID, s, 1)] = true
	}
	return m
}

func branches(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("b%d", i)
	}
	return out
}

// TestFanOutTwentyBranchesEightAtOnce: twenty branches are ready at once;
// the provider holds every call: it sees eight in flight (policy's
// default), never more, then all twenty complete and the join's prompt
// has every output.
func TestFanOutTwentyBranchesEightAtOnce(t *testing.T) {
	t.Parallel()
	p := setupProc(t, time.Second)
	runID := event.NewRunID()
	keys := keysOf(runID, branches(20)...)
	hold := p.LLM.Hold(func(c providertest.Call) bool { return keys[c.IdempotencyKey] })
	w := p.palWorker(t, "w1")
	p.startAs(t, runID, fanOutWorkflow(20, true, ""), `{"topic":"pal"}`)
	ctx := ctxFor(t, time.Minute)
	for range 8 {
		_, err := hold.Wait(ctx)
		require.NoError(t, err, w.Output())
	}
	require.Equal(t, 8, p.LLM.InFlight(), "eight calls held at once")
	hold.Release()

	require.Equal(t, event.RunSucceeded, p.WaitEnd(t, runID).Kind)
	require.Equal(t, 8, p.LLM.MaxConcurrent(), "never more than eight in flight")
	want := map[string]int{key(runID, "join", 1): 1}
	for k := range keys {
		want[k] = 1
	}
	require.Equal(t, want, p.LLM.Keys(), "each branch sent once, then the join")
	join := p.LLM.CallsWithKey(key(runID, "join", 1))
	require.Len(t, join, 1)
	for i := range 20 {
		require.Contains(t, join[0].LastUser(), fmt.Sprintf("echo: branch %02d of pal", i), "the join sees every branch")
	}
}

// TestBudgetFitsSixOfTenBranches: ten branches are ready at once, and
// the budget holds the worst cases of six: exactly six are sent,
// together, and the run stops with budget_exceeded within its budget.
func TestBudgetFitsSixOfTenBranches(t *testing.T) {
	t.Parallel()
	p := setupProc(t, time.Second)
	// Each branch's worst case, as the engine reckons it: a quarter of its
	// rendered input's bytes, and its maxTokens (50), at the run's prices.
	probe, err := workflow.Parse([]byte(fanOutWorkflow(10, false, "")))
	require.NoError(t, err)
	node, _ := probe.Node("b0")
	in, err := engine.RenderInput(node, workflow.Env{Input: map[string]any{"topic": "pal"}})
	require.NoError(t, err)
	tokens, cost, priced := engine.EstimateCall(in, engine.PricesFor(provider.Prices(), probe))
	require.True(t, priced)
	budget := 6.5 * cost
	wf := fanOutWorkflow(10, false, fmt.Sprintf(`"policy":{"budget":{"maxCostUsd":%g}}`, budget))
	// The provider spends each call's worst case, to the token.
	p.LLM.SetResponder(func(providertest.Call) providertest.Reply {
		return providertest.Reply{Text: "ok", InputTokens: int64(tokens) - 50, OutputTokens: 50}
	})
	runID := event.NewRunID()
	keys := keysOf(runID, branches(10)...)
	hold := p.LLM.Hold(func(c providertest.Call) bool { return keys[c.IdempotencyKey] })
	p.palWorker(t, "w1")
	p.startAs(t, runID, wf, `{"topic":"pal"}`)
	ctx := ctxFor(t, time.Minute)
	for range 6 {
		_, err := hold.Wait(ctx)
		require.NoError(t, err)
	}
	hold.Release()

	end := p.WaitEnd(t, runID)
	require.Equal(t, event.RunFailed, end.Kind)
	require.Equal(t, event.CodeBudgetExceeded, data[event.RunFailedData](t, end).Code)
	require.Len(t, p.LLM.Calls(), 6, "exactly six sent")
	require.Equal(t, 6, p.LLM.MaxConcurrent(), "the six went together")
	st, err := engine.Fold(p.Events(t, runID))
	require.NoError(t, err)
	require.Len(t, find(p.Events(t, runID), event.StepStarted, ""), 6)
	require.LessOrEqual(t, st.Usage.CostUSD, budget, "spend within the budget")
	require.InDelta(t, 6*cost, st.Usage.CostUSD, 1e-12)
	require.Len(t, find(p.Events(t, runID), event.BudgetExceeded, ""), 1)
}

// failingFanOut is a, b and c from the trigger; a's onFailure is given.
func failingFanOut(onFailure string) string {
	return `{"name":"fail-one","nodes":[{"id":"start","type":"trigger"},
		{"id":"a","type":"ai-step"` + onFailure + `,"data":{"provider":"openai","model":"gpt-4o-mini","prompt":"a"}},
		{"id":"b","type":"ai-step","data":{"provider":"openai","model":"gpt-4o-mini","prompt":"b"}},
		{"id":"c","type":"ai-step","data":{"provider":"openai","model":"gpt-4o-mini","prompt":"c"}},
		{"id":"report","type":"tool","data":{"tool":"echo","input":{"b":"{{steps.b.output.text}}"}}}],
		"edges":[{"from":"start","to":"a"},{"from":"start","to":"b"},{"from":"start","to":"c"},
		 {"from":"a","to":"report","condition":"steps.a.status == \"failed\""},{"from":"b","to":"report"},{"from":"c","to":"report"}]}`
}

// TestFailedBranchInterruptsSiblings: a fails while b and c are in
// flight: their calls are cancelled (the provider sees the client give
// up, and answers neither), each is journaled as interrupted by a, and
// the run fails naming a. With onFailure "continue" on a, the run goes
// on, and the edge that reads a's status fires.
func TestFailedBranchInterruptsSiblings(t *testing.T) {
	t.Parallel()
	p := setupProc(t, time.Second)
	p.palWorker(t, "w1")
	ctx := ctxFor(t, time.Minute)

	runID := event.NewRunID()
	keys := keysOf(runID, "b", "c")
	holdA := p.LLM.Hold(providertest.ByKey(key(runID, "a", 1)))
	holdBC := p.LLM.Hold(func(c providertest.Call) bool { return keys[c.IdempotencyKey] })
	defer holdBC.Release()
	p.LLM.FailNext(providertest.ByKey(key(runID, "a", 1)), 400, 1)
	p.startAs(t, runID, failingFanOut(""), `{}`)
	for _, h := range []*providertest.Hold{holdA, holdBC, holdBC} {
		_, err := h.Wait(ctx)
		require.NoError(t, err)
	}
	holdA.Release() // a fails (400, not retried); b and c stay held

	end := p.WaitEnd(t, runID)
	require.Equal(t, event.RunFailed, end.Kind)
	require.Equal(t, "a", data[event.RunFailedData](t, end).StepID)
	evs := p.Events(t, runID)
	for _, s := range []string{"b", "c"} {
		require.Empty(t, find(evs, event.StepCompleted, s), "%s did not complete", s)
		f := find(evs, event.StepFailed, s)
		require.Len(t, f, 1)
		d := data[event.StepFailedData](t, f[0])
		require.Equal(t, event.ClassInterrupted, d.Class)
		require.Equal(t, "a", d.InterruptedBy)
		require.True(t, d.OutcomeUnknown)
		require.Less(t, f[0].Seq, end.Seq)
	}
	require.Eventually(t, func() bool { return len(p.LLM.Abandoned()) == 2 }, 30*time.Second, 10*time.Millisecond,
		"b's and c's calls were cancelled")
	for _, c := range p.LLM.Answered() {
		require.False(t, keys[c.IdempotencyKey], "no branch was answered")
	}

	// onFailure "continue": a's failure resolves it; report runs after b
	// and c, by an edge on steps.a.status.
	cont := event.NewRunID()
	p.LLM.FailNext(providertest.ByKey(key(cont, "a", 1)), 400, 1)
	p.startAs(t, cont, failingFanOut(`,"onFailure":"continue"`), `{}`)
	end = p.WaitEnd(t, cont)
	require.Equal(t, event.RunSucceeded, end.Kind)
	evs = p.Events(t, cont)
	require.Len(t, find(evs, event.StepFailed, "a"), 1)
	require.Len(t, find(evs, event.StepCompleted, "report"), 1, "the edge saw a failed")
	require.JSONEq(t, `{"b":"echo: b"}`, string(data[event.RunSucceededData](t, end).Output))
}

// TestAgentToolCallsOverlap: the model asks for four tool calls in one
// turn; the receiver the http tool calls holds all four at once, and the
// next turn lists the four results in the model's order.
func TestAgentToolCallsOverlap(t *testing.T) {
	t.Parallel()
	p := setupProc(t, time.Second)
	p.LLM.SetResponder(func(c providertest.Call) providertest.Reply {
		if len(c.Messages) > 1 {
			return providertest.Reply{Text: "done"}
		}
		var calls []provider.ToolCall
		for i := range 4 {
			args := fmt.Sprintf(`{"method":"POST","url":%q,"body":{"i":%d}}`, fmt.Sprintf("%s/t/%d", p.Hook.URL(), i), i)
			calls = append(calls, provider.ToolCall{ID: fmt.Sprintf("call_%d", i), Name: "http", Arguments: json.RawMessage(args)})
		}
		return providertest.Reply{ToolCalls: calls}
	})
	hold := p.Hook.Hold(func(r connectortest.Request) bool { return strings.HasPrefix(r.Path, "/t/") })
	p.palWorker(t, "w1")
	runID := event.NewRunID()
	p.startAs(t, runID, `{"name":"agent","nodes":[{"id":"start","type":"trigger"},
		{"id":"ask","type":"agent","data":{"provider":"openai","model":"gpt-4o-mini","prompt":"go","tools":[{"name":"http"}]}}],
		"edges":[{"from":"start","to":"ask"}]}`, `{}`)
	ctx := ctxFor(t, time.Minute)
	for range 4 {
		_, err := hold.Wait(ctx)
		require.NoError(t, err)
	}
	require.Len(t, p.Hook.Requests(), 4, "the four requests are at the receiver at once")
	hold.Release()

	require.Equal(t, event.RunSucceeded, p.WaitEnd(t, runID).Kind)
	turn := p.LLM.CallsWithKey(key(runID, "ask.turn[1]", 1))
	require.Len(t, turn, 1)
	msgs := turn[0].Messages
	require.Len(t, msgs, 6) // the prompt, the answer with its calls, four results
	for j, m := range msgs[2:] {
		require.Equal(t, provider.RoleTool, m.Role)
		require.Equal(t, fmt.Sprintf("call_%d", j), m.ToolCallID, "in the model's order")
		require.Contains(t, m.Content, key(runID, fmt.Sprintf("ask.turn[0].tool[%d]", j), 1), "call %d's own result", j)
	}
}
