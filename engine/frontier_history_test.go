package engine_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
)

// The frontier's saved histories: branches that run at once and join,
// a failed branch, a fan-out a crash interrupted, a parallel loop and an
// agent turn's tool calls run together.

// Run ids of the frontier's scenarios.
const (
	runFanOut         = "run_01JNB6W2G8Z4K0S1C5V7X9D3C0"
	runFanIn          = "run_01JNB6W2G8Z4K0S1C5V7X9D3C1"
	runFailedBranch   = "run_01JNB6W2G8Z4K0S1C5V7X9D3C2"
	runBranchContinue = "run_01JNB6W2G8Z4K0S1C5V7X9D3C3"
	runResumedFanOut  = "run_01JNB6W2G8Z4K0S1C5V7X9D3C4"
	runParallelLoop   = "run_01JNB6W2G8Z4K0S1C5V7X9D3C5"
	runParallelTools  = "run_01JNB6W2G8Z4K0S1C5V7X9D3C6"
	runBudgetFanOut   = "run_01JNB6W2G8Z4K0S1C5V7X9D3C7"
)

func frontierScenarios() []scenario {
	return []scenario{
		{name: "fan_out", build: buildFanOut},
		{name: "fan_in", build: buildFanIn},
		{name: "failed_branch", build: buildFailedBranch},
		{name: "failed_branch_continue", build: buildFailedBranchContinue},
		{name: "resumed_fan_out", build: buildResumedFanOut},
		{name: "parallel_loop", build: buildParallelLoop},
		{name: "parallel_tool_calls", build: buildParallelTools},
		{name: "budget_fan_out", build: buildBudgetFanOut},
	}
}

// wfFanOut: three ai-steps from the trigger, joined by a fourth that
// reads all three.
const wfFanOut = `{"name":"fan-out","nodes":[{"id":"start","type":"trigger"},
	{"id":"a","type":"ai-step","data":{"provider":"openai","model":"gpt-4o-mini","maxTokens":100,"prompt":"angle a on {{input.topic}}"}},
	{"id":"b","type":"ai-step","data":{"provider":"openai","model":"gpt-4o-mini","maxTokens":100,"prompt":"angle b on {{input.topic}}"}},
	{"id":"c","type":"ai-step","data":{"provider":"openai","model":"gpt-4o-mini","maxTokens":100,"prompt":"angle c on {{input.topic}}"}},
	{"id":"join","type":"ai-step","data":{"provider":"openai","model":"gpt-4o-mini",
	 "prompt":"Combine: {{steps.a.output.text}} | {{steps.b.output.text}} | {{steps.c.output.text}}"}}],
	"edges":[{"from":"start","to":"a"},{"from":"start","to":"b"},{"from":"start","to":"c"},
	 {"from":"a","to":"join"},{"from":"b","to":"join"},{"from":"c","to":"join"}]}`

const inputFanOut = `{"topic":"durable agents"}`

// fanOut starts the three branches together, as one drive does.
func fanOut(t testing.TB, runID, wf string) *history {
	h := newHistory(t, runID, wf, inputFanOut).resume("worker-a")
	require.Equal(t, []string{"a", "b", "c"}, h.ready(), "the three branches are ready at once")
	return h.start("a").start("b").start("c")
}

func buildFanOut(t testing.TB) []event.Event {
	h := fanOut(t, runFanOut, wfFanOut)
	require.Empty(t, h.ready(), "everything ready is in flight")
	h.llmEnd("b", "B", "gpt-4o-mini", 28, 9)
	require.Empty(t, h.ready(), "the join waits for a and c")
	return h.events()
}

func buildFanIn(t testing.TB) []event.Event {
	h := fanOut(t, runFanIn, wfFanOut)
	h.llmEnd("c", "C", "gpt-4o-mini", 28, 9).llmEnd("a", "A", "gpt-4o-mini", 28, 9)
	require.Empty(t, h.ready(), "the join waits for b")
	h.llmEnd("b", "B", "gpt-4o-mini", 28, 9)
	require.Equal(t, []string{"join"}, h.ready())
	require.JSONEq(t, `{"provider":"openai","model":"gpt-4o-mini","maxTokens":4096,"messages":[{"role":"user","content":"Combine: A | B | C"}]}`,
		string(h.plan("join").Input), "the join reads every branch")
	h.llm("join", "A, B and C", "gpt-4o-mini", 30, 5)
	return h.finish().events()
}

// buildFailedBranch: a fails; b and c, in flight, are interrupted; the
// run fails naming a.
func buildFailedBranch(t testing.TB) []event.Event {
	h := fanOut(t, runFailedBranch, wfFanOut)
	require.False(t, h.failTry("a", "openai: 400 Bad Request", event.ClassLLM, false, false, 0))
	h.interrupt("b", "a").interrupt("c", "a")
	return h.finish().events()
}

// wfFanOutContinue: a continues past its failure; report runs after a
// and b, and its edge from a fires only when a failed.
const wfFanOutContinue = `{"name":"fan-out-continue","nodes":[{"id":"start","type":"trigger"},
	{"id":"a","type":"ai-step","onFailure":"continue","data":{"provider":"openai","model":"gpt-4o-mini","prompt":"angle a on {{input.topic}}"}},
	{"id":"b","type":"ai-step","data":{"provider":"openai","model":"gpt-4o-mini","prompt":"angle b on {{input.topic}}"}},
	{"id":"report","type":"tool","data":{"tool":"echo","input":{"b":"{{steps.b.output.text}}"}}}],
	"edges":[{"from":"start","to":"a"},{"from":"start","to":"b"},
	 {"from":"a","to":"report","condition":"steps.a.status == \"failed\" && steps.a.error != \"\""},{"from":"b","to":"report"}]}`

func buildFailedBranchContinue(t testing.TB) []event.Event {
	h := newHistory(t, runBranchContinue, wfFanOutContinue, inputFanOut).resume("worker-a")
	h.start("a").start("b")
	require.False(t, h.failTry("a", "openai: 400 Bad Request", event.ClassLLM, false, false, 0))
	require.Empty(t, h.ready(), "the run goes on: report waits for b")
	h.llmEnd("b", "B", "gpt-4o-mini", 28, 9)
	require.Equal(t, []string{"report"}, h.ready())
	h.start("report").complete("report", `{"b":"B"}`, nil)
	return h.finish().events()
}

// buildResumedFanOut: worker-a dies with b and c in flight; worker-b
// sends exactly those again, with their keys, and never a.
func buildResumedFanOut(t testing.TB) []event.Event {
	h := fanOut(t, runResumedFanOut, wfFanOut)
	h.llmEnd("a", "A", "gpt-4o-mini", 28, 9)
	h.wait(200 * time.Millisecond).resume("worker-b")
	require.Equal(t, []string{"b", "c"}, h.ready())
	for _, id := range []string{"b", "c"} {
		p := h.plan(id)
		require.True(t, p.Started, "%s is sent again as started", id)
		require.Equal(t, event.IdempotencyKey(runResumedFanOut, id, 1), p.Key)
	}
	h.llmEnd("c", "C", "gpt-4o-mini", 28, 9).llmEnd("b", "B", "gpt-4o-mini", 28, 9)
	h.llm("join", "A, B and C", "gpt-4o-mini", 30, 5)
	return h.finish().events()
}

// wfParallelLoop: five items, two iterations in progress at once.
const wfParallelLoop = `{"name":"each","nodes":[{"id":"start","type":"trigger"},
	{"id":"each","type":"loop","data":{"over":"{{input.xs}}","concurrency":2,"body":{"name":"one","nodes":[{"id":"start","type":"trigger"},
		{"id":"ask","type":"ai-step","data":{"provider":"openai","model":"gpt-4o-mini","prompt":"item {{input.item}}"}}],
		"edges":[{"from":"start","to":"ask"}]}}}],"edges":[{"from":"start","to":"each"}]}`

func buildParallelLoop(t testing.TB) []event.Event {
	h := newHistory(t, runParallelLoop, wfParallelLoop, `{"xs":[10,11,12,13,14]}`).resume("worker-a")
	ask := func(i int) string { return fmt.Sprintf("each[%d].ask", i) }
	require.Equal(t, []string{ask(0), ask(1)}, h.ready())
	h.start(ask(0)).start(ask(1))
	require.Empty(t, h.ready(), "two in progress")
	h.llmEnd(ask(1), "r11", "gpt-4o-mini", 3, 1)
	require.Equal(t, []string{ask(2)}, h.ready(), "one finished: the next starts, ahead of iteration 0")
	h.start(ask(2)).llmEnd(ask(0), "r10", "gpt-4o-mini", 3, 1)
	require.Equal(t, []string{ask(3)}, h.ready())
	h.start(ask(3)).llmEnd(ask(3), "r13", "gpt-4o-mini", 3, 1)
	require.Equal(t, []string{ask(4)}, h.ready())
	h.start(ask(4)).llmEnd(ask(4), "r14", "gpt-4o-mini", 3, 1).llmEnd(ask(2), "r12", "gpt-4o-mini", 3, 1)
	p := h.plan("each")
	var out engine.LoopOutput
	require.NoError(t, json.Unmarshal(p.Output, &out))
	var texts []string
	for _, r := range out.Results {
		var o engine.LLMOutput
		require.NoError(t, json.Unmarshal(r, &o))
		texts = append(texts, o.Text)
	}
	require.Equal(t, []string{"r10", "r11", "r12", "r13", "r14"}, texts, "results in the items' order")
	h.pure("each")
	return h.finish().events()
}

// buildParallelTools: the model asks for three lookups in one turn; they
// run together and finish out of order; the next turn lists the results
// in the model's order.
func buildParallelTools(t testing.TB) []event.Event {
	h := newHistory(t, runParallelTools, wfAgent, `{"q":"pal"}`).resume("worker-a")
	h.turn("ask.turn[0]", provider2{"lookup", `{"q":"a"}`}, provider2{"lookup", `{"q":"b"}`}, provider2{"lookup", `{"q":"c"}`})
	calls := []string{"ask.turn[0].tool[0]", "ask.turn[0].tool[1]", "ask.turn[0].tool[2]"}
	require.Equal(t, calls, h.ready())
	h.start(calls[0]).start(calls[1]).start(calls[2])
	h.complete(calls[2], `{"hits":2}`, nil).complete(calls[0], `{"hits":0}`, nil)
	require.Empty(t, h.ready(), "the next turn waits for every call")
	h.complete(calls[1], `{"hits":1}`, nil)
	var in engine.AIInput
	require.NoError(t, json.Unmarshal(h.plan("ask.turn[1]").Input, &in))
	require.Len(t, in.Messages, 4)
	for i, m := range in.Messages[1:] {
		require.Equal(t, fmt.Sprintf("call_%d", i), m.ToolCallID, "in the model's order")
		require.Equal(t, fmt.Sprintf(`{"hits":%d}`, i), m.Content)
	}
	h.turn("ask.turn[1]").pure("ask")
	return h.finish().events()
}

// buildBudgetFanOut: two of the three branches' worst cases fit the
// budget together; the third waits while they are in flight, and once
// nothing is, does not fit: budget_exceeded, and the run fails.
func buildBudgetFanOut(t testing.TB) []event.Event {
	// Each branch's worst case: a quarter of its input's bytes (32 tokens)
	// and its maxTokens (100); c's input is as long as a's and b's.
	wf := withPolicy(t, wfFanOut, `{"budget":{"maxTokens":300}}`)
	h := newStarted(t, runBudgetFanOut, wf, inputFanOut, nil).resume("worker-a")
	for _, id := range []string{"a", "b"} {
		tokens, _, _ := engine.EstimateCall(h.plan(id).Input, h.st.Prices())
		require.Equal(t, 132.0, tokens, "%s's worst case", id)
	}
	require.Equal(t, []string{"a", "b"}, h.ready(), "c's worst case does not fit beside a's and b's")
	h.start("a").start("b")
	h.llmEnd("a", "A", "gpt-4o-mini", 32, 100)
	require.Empty(t, h.ready(), "c waits while b is in flight")
	h.llmEnd("b", "B", "gpt-4o-mini", 32, 100)
	h.brake(event.BudgetExceeded)
	return h.finish().events()
}
