package engine_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/provider"
	"github.com/palrun/pal/workflow"
)

const wfApproval = `{"name":"ship","nodes":[{"id":"start","type":"trigger"},
	{"id":"draft","type":"tool","data":{"tool":"echo","input":{"t":"{{input.t}}"}}},
	{"id":"ok","type":"approval","data":{"prompt":"Ship {{steps.draft.output.t}}?","timeoutMs":60000}},
	{"id":"ship","type":"tool","data":{"tool":"echo"}}],
	"edges":[{"from":"start","to":"draft"},{"from":"draft","to":"ok"},{"from":"ok","to":"ship"}]}`

func TestApprovalWaitsThenApplies(t *testing.T) {
	t.Parallel()
	h := newHistory(t, testRun, wfApproval, `{"t":"v1"}`).resume("w")
	h.start("draft").complete("draft", `{"t":"v1"}`, nil)
	p := h.plan("ok")
	require.NotNil(t, p.Wait)
	require.False(t, p.Wait.Waiting)
	require.Equal(t, 60000, p.Wait.TimeoutMs)
	require.JSONEq(t, `{"prompt":"Ship v1?"}`, string(p.Input))
	h.start("ok")
	h.append(event.StepWaiting, "ok", 1, event.StepWaitingData{Reason: event.WaitApproval, TimeoutAt: "2025-03-01T10:00:00Z"})
	require.Equal(t, engine.StatusWaiting, h.st.Status)
	p = h.plan("ok")
	require.True(t, p.Wait.Waiting, "the wait is journaled: park")
	require.Equal(t, "2025-03-01T10:00:00Z", p.Wait.TimeoutAt.UTC().Format("2006-01-02T15:04:05Z"))

	h.append(event.ApprovalReceived, "ok", 0, event.ApprovalReceivedData{Decision: event.DecisionApprove, Approver: "ana", Comment: "go"})
	p = h.plan("ok")
	require.True(t, p.Pure)
	require.JSONEq(t, `{"approved":true,"decision":"approve","approver":"ana","comment":"go","timed_out":false}`, string(p.Output))
	h.resume("w2").pure("ok")
	h.start("ship")
}

// TestApprovalTimeoutIsDecidedByNow: whether a wait has timed out is
// Next's decision, at the time it is given; the journal alone does not
// change when the deadline passes.
func TestApprovalTimeoutIsDecidedByNow(t *testing.T) {
	t.Parallel()
	h := newHistory(t, testRun, wfRelease, inputRelease).resume("w")
	planned := h.plan("ok")
	require.Equal(t, h.now.Add(time.Hour), planned.Wait.TimeoutAt, "a new wait's deadline is now plus timeoutMs")
	h.waitFor("ok")
	deadline := h.st.Steps["ok"].TimeoutAt
	require.Equal(t, planned.Wait.TimeoutAt, deadline)
	timedOut := `{"approved":false,"decision":"timeout","timed_out":true}`
	tests := []struct {
		name    string
		now     time.Time
		waiting bool
	}{
		{"long before", baseTS, true},
		{"a nanosecond before", deadline.Add(-time.Nanosecond), true},
		{"at the deadline", deadline, false},
		{"after", deadline.Add(24 * time.Hour), false},
		{"in another zone", deadline.In(time.FixedZone("X", 5*3600)), false},
	}
	for _, tt := range tests {
		rs, ok := engine.Next(h.st.Workflow, h.st, tt.now).(engine.RunStep)
		require.True(t, ok, tt.name)
		p := rs.Plan
		require.Equal(t, "ok", p.StepID, tt.name)
		if tt.waiting {
			require.NotNil(t, p.Wait, tt.name)
			require.True(t, p.Wait.Waiting, tt.name)
			require.Equal(t, deadline, p.Wait.TimeoutAt, tt.name)
			require.False(t, p.Pure, tt.name)
			continue
		}
		require.Nil(t, p.Wait, tt.name)
		require.True(t, p.Pure, tt.name)
		require.True(t, p.Started, tt.name)
		require.JSONEq(t, timedOut, string(p.Output), tt.name)
	}

	// A decision in the journal wins over a deadline that passed since.
	h.append(event.ApprovalReceived, "ok", 0, event.ApprovalReceivedData{Decision: event.DecisionApprove, Approver: "ana"})
	rs := engine.Next(h.st.Workflow, h.st, deadline.Add(time.Hour)).(engine.RunStep)
	require.JSONEq(t, `{"approved":true,"decision":"approve","approver":"ana","timed_out":false}`, string(rs.Plan.Output))

	// Without timeoutMs a wait never times out.
	h = newHistory(t, testRun, approvalNoTimeout, `{}`).resume("w").waitFor("ok")
	require.True(t, h.st.Steps["ok"].TimeoutAt.IsZero())
	rs = engine.Next(h.st.Workflow, h.st, baseTS.Add(1000*24*time.Hour)).(engine.RunStep)
	require.True(t, rs.Plan.Wait.Waiting)
}

// TestChildTriggerMetaCarriesTheChain: what a parent writes into its
// child's run_created is what Chain reads back in the child.
func TestChildTriggerMetaCarriesTheChain(t *testing.T) {
	t.Parallel()
	parent := newHistory(t, testRun, wfApproval, `{}`)
	parent.st.Created.TriggerMeta = map[string]any{"chain": []any{"run_root"}}
	meta := engine.ChildTriggerMeta(parent.st, "kid")
	require.Equal(t, testRun, meta["parent_run_id"])
	require.Equal(t, "kid", meta["parent_step_id"])

	childID := event.ChildRunID(testRun, "kid")
	ev := event.MustNew(event.RunCreated, "", 0, event.RunCreatedData{Input: json.RawMessage(`{}`),
		ParentRunID: testRun, ParentStepID: "kid", Depth: 1, TriggerMeta: meta})
	ev.RunID, ev.Seq, ev.TS = childID, 1, baseTS
	body, err := event.Encode(ev)
	require.NoError(t, err)
	evs, err := event.Decode(body) // through the wire, as the child reads it
	require.NoError(t, err)
	child, err := engine.Fold(evs)
	require.NoError(t, err)
	require.Equal(t, []string{"run_root", testRun, childID}, engine.Chain(child))
}

const approvalNoTimeout = `{"name":"forever","nodes":[{"id":"start","type":"trigger"},{"id":"ok","type":"approval"}],
	"edges":[{"from":"start","to":"ok"}]}`

func TestEarlyApprovalIsKeptUntilTheStep(t *testing.T) {
	t.Parallel()
	h := newHistory(t, testRun, wfApproval, `{"t":"v1"}`).resume("w")
	h.append(event.ApprovalReceived, "ok", 0, event.ApprovalReceivedData{Decision: event.DecisionApprove, Approver: "bo"})
	h.start("draft").complete("draft", `{"t":"v1"}`, nil)
	p := h.plan("ok")
	require.True(t, p.Pure, "the decision waits in the journal for its step")
	require.Nil(t, p.Wait)
}

func TestRejectionFailsUnlessRouted(t *testing.T) {
	t.Parallel()
	h := newHistory(t, testRun, wfApproval, `{"t":"v1"}`).resume("w")
	h.start("draft").complete("draft", `{"t":"v1"}`, nil)
	h.append(event.ApprovalReceived, "ok", 0, event.ApprovalReceivedData{Decision: event.DecisionReject, Approver: "cy", Comment: "not yet"})
	h.pure("ok")
	f, ok := next(h).(engine.Fail)
	require.True(t, ok)
	require.Equal(t, engine.CodeRejected, f.Code)
	require.Equal(t, "step ok was rejected by cy: not yet", f.Error)

	routed := `{"name":"route","nodes":[{"id":"start","type":"trigger"},{"id":"ok","type":"approval"},
		{"id":"yes","type":"tool","data":{"tool":"echo"}},{"id":"no","type":"tool","data":{"tool":"echo"}}],
		"edges":[{"from":"start","to":"ok"},{"from":"ok","to":"yes","condition":"steps.ok.output.approved"},
		{"from":"ok","to":"no","condition":"!steps.ok.output.approved"}]}`
	h = newHistory(t, testRun, routed, `{}`).resume("w")
	h.append(event.ApprovalReceived, "ok", 0, event.ApprovalReceivedData{Decision: event.DecisionReject, Approver: "cy"})
	h.pure("ok")
	h.plan("no")
}

const wfLoop = `{"name":"each","nodes":[{"id":"start","type":"trigger"},
	{"id":"each","type":"loop","data":{"over":"{{input.urls}}","with":{"tag":"{{input.tag}}"},"body":{"name":"one","nodes":[
		{"id":"start","type":"trigger"},
		{"id":"fetch","type":"tool","data":{"tool":"http","input":{"url":"{{input.item}}","i":"{{input.index}}","tag":"{{input.with.tag}}"}}},
		{"id":"sum","type":"tool","data":{"tool":"echo","input":{"got":"{{steps.fetch.output.n}}"}}}],
		"edges":[{"from":"start","to":"fetch"},{"from":"fetch","to":"sum"}]}}},
	{"id":"after","type":"tool","data":{"tool":"echo","input":{"n":"{{steps.each.output.iterations}}"}}}],
	"edges":[{"from":"start","to":"each"},{"from":"each","to":"after"}]}`

func TestLoopIterationsAreStepsAndResumeMidLoop(t *testing.T) {
	t.Parallel()
	h := newHistory(t, testRun, wfLoop, `{"urls":["a","b","c"],"tag":"x"}`).resume("w")
	for i := 0; i < 2; i++ {
		f := fmt.Sprintf("each[%d].fetch", i)
		p := h.plan(f)
		require.JSONEq(t, fmt.Sprintf(`{"tool":"http","input":{"url":%q,"i":%d,"tag":"x"}}`, []string{"a", "b", "c"}[i], i), string(p.Input))
		require.Equal(t, event.IdempotencyKey(testRun, f, 1), p.Key)
		h.start(f).complete(f, fmt.Sprintf(`{"n":%d}`, i*10), nil)
		s := fmt.Sprintf("each[%d].sum", i)
		h.start(s).complete(s, fmt.Sprintf(`{"got":%d}`, i*10), nil)
	}
	// A crash in iteration 2: the re-drive resumes there, not at 0.
	h.start("each[2].fetch").resume("w2")
	p := h.plan("each[2].fetch")
	require.True(t, p.Started)
	h.complete("each[2].fetch", `{"n":20}`, nil).start("each[2].sum").complete("each[2].sum", `{"got":20}`, nil)
	p = h.plan("each")
	require.True(t, p.Pure)
	require.JSONEq(t, `{"iterations":3,"results":[{"got":0},{"got":10},{"got":20}],"stopped":"items"}`, string(p.Output))
	h.pure("each")
	require.JSONEq(t, `{"tool":"echo","input":{"n":3}}`, string(h.plan("after").Input))
}

func TestLoopUntilAndBounds(t *testing.T) {
	t.Parallel()
	wf := `{"name":"poll","nodes":[{"id":"start","type":"trigger"},
		{"id":"poll","type":"loop","data":{"until":"steps.check.output.done","maxIterations":5,"body":{"name":"b","nodes":[
			{"id":"start","type":"trigger"},{"id":"check","type":"tool","data":{"tool":"status"}}],
			"edges":[{"from":"start","to":"check"}]}}}],
		"edges":[{"from":"start","to":"poll"}]}`
	h := newHistory(t, testRun, wf, `{}`).resume("w")
	h.start("poll[0].check").complete("poll[0].check", `{"done":false}`, nil)
	h.start("poll[1].check").complete("poll[1].check", `{"done":true}`, nil)
	p := h.plan("poll")
	require.JSONEq(t, `{"iterations":2,"results":[{"done":false},{"done":true}],"stopped":"until"}`, string(p.Output))

	h = newHistory(t, testRun, wfLoop, `{"urls":"nope","tag":"x"}`).resume("w")
	f, ok := next(h).(engine.Fail)
	require.True(t, ok)
	require.Equal(t, engine.CodeLoop, f.Code)
	require.Contains(t, f.Error, `over gave "nope", want an array`)
}

func TestSubagentChildIDAndDepthLimit(t *testing.T) {
	t.Parallel()
	wf := `{"name":"parent","nodes":[{"id":"start","type":"trigger"},
		{"id":"kid","type":"subagent","data":{"input":{"q":"{{input.q}}"},"workflow":{"name":"child","nodes":[{"id":"start","type":"trigger"},
			{"id":"a","type":"tool","data":{"tool":"echo"}}],"edges":[{"from":"start","to":"a"}]}}}],
		"edges":[{"from":"start","to":"kid"}]}`
	h := newHistory(t, testRun, wf, `{"q":"why"}`).resume("w")
	p := h.plan("kid")
	require.Equal(t, engine.ExecSubagent, p.Exec)
	require.Equal(t, event.ChildRunID(testRun, "kid"), p.ChildRunID)
	require.JSONEq(t, `{"input":{"q":"why"}}`, string(p.Input))

	// A run at depth 5 may not start a sixth level; the error names the chain.
	deep := newHistory(t, testRun, wf, `{"q":"why"}`)
	deep.st.Created.Depth = 5
	deep.st.Created.TriggerMeta = map[string]any{"chain": []any{"run_a", "run_b", "run_c", "run_d", "run_e"}}
	f, ok := engine.Next(deep.st.Workflow, deep.st, deep.now).(engine.Fail)
	require.True(t, ok)
	require.Equal(t, event.CodeDepthExceeded, f.Code)
	require.Equal(t, "step kid would start a subagent at depth 6, over the limit of 5 (chain: run_a → run_b → run_c → run_d → run_e → "+testRun+")", f.Error)
}

func TestAgentTurnsAndToolCallsAreSteps(t *testing.T) {
	t.Parallel()
	wf := `{"name":"agent","nodes":[{"id":"start","type":"trigger"},
		{"id":"ask","type":"agent","data":{"provider":"openai","model":"gpt-4o-mini","system":"be brief","prompt":"weather in {{input.city}}?","maxTurns":3,
		 "tools":[{"name":"weather","description":"current weather","parameters":{"type":"object"}}]}}],
		"edges":[{"from":"start","to":"ask"}]}`
	h := newHistory(t, testRun, wf, `{"city":"Oslo"}`).resume("w")
	p := h.plan("ask.turn[0]")
	require.Equal(t, engine.ExecLLM, p.Exec)
	var in engine.AIInput
	require.NoError(t, json.Unmarshal(p.Input, &in))
	require.Equal(t, []provider.Message{{Role: "user", Content: "weather in Oslo?"}}, in.Messages)
	require.Equal(t, "weather", in.Tools[0].Name)
	h.start("ask.turn[0]").complete("ask.turn[0]", `{"text":"","tool_calls":[{"id":"c1","name":"weather","arguments":{"city":"Oslo"}}]}`, nil)

	p = h.plan("ask.turn[0].tool[0]")
	require.Equal(t, engine.ExecTool, p.Exec)
	require.JSONEq(t, `{"tool":"weather","input":{"city":"Oslo"},"tool_call_id":"c1"}`, string(p.Input))
	h.start("ask.turn[0].tool[0]").complete("ask.turn[0].tool[0]", `{"temp":3}`, nil)

	// Resumed here, the next turn's request is the whole conversation,
	// rebuilt from the journal; turn 0 is not planned again. Its
	// step_started journals only the two messages added since turn 0.
	h.resume("w2")
	p = h.plan("ask.turn[1]")
	require.False(t, p.Started)
	require.NoError(t, json.Unmarshal(p.Input, &in))
	require.Equal(t, 1, in.Prior)
	require.Len(t, in.Messages, 2)
	require.Equal(t, "assistant", in.Messages[0].Role)
	in = engine.AIInput{}
	require.NoError(t, json.Unmarshal(p.Call(), &in))
	require.Zero(t, in.Prior)
	require.Len(t, in.Messages, 3)
	require.Equal(t, "assistant", in.Messages[1].Role)
	require.Equal(t, "c1", in.Messages[1].ToolCalls[0].ID)
	require.Equal(t, provider.Message{Role: "tool", ToolCallID: "c1", Content: `{"temp":3}`}, in.Messages[2])
	whole := p.Call()
	// A turn journaled whole (as before turns journaled their new
	// messages only) resumes with the same request.
	old := event.MustNew(event.StepStarted, p.StepID, p.Attempt, event.StepStartedData{
		NodeID: p.NodeID, NodeType: p.NodeType, Input: whole, IdempotencyKey: p.Key})
	old.RunID, old.Seq, old.TS, old.WorkerID = h.runID, uint64(len(h.evs))+1, h.now, "w2"
	st, err := engine.Fold(append(append([]event.Event(nil), h.evs...), old))
	require.NoError(t, err)
	a, ok := engine.Next(st.Workflow, st, h.now).(engine.RunStep)
	require.True(t, ok)
	require.True(t, a.Plan.Started)
	require.JSONEq(t, string(whole), string(a.Plan.Call()))
	p2 := h.start("ask.turn[1]").plan("ask.turn[1]")
	require.True(t, p2.Started)
	require.JSONEq(t, string(whole), string(p2.Call()))
	h.complete("ask.turn[1]", `{"text":"3 degrees"}`, nil)
	p = h.plan("ask")
	require.True(t, p.Pure)
	require.JSONEq(t, `{"text":"3 degrees","turns":2}`, string(p.Output))
}

func TestAgentMaxTurns(t *testing.T) {
	t.Parallel()
	wf := `{"name":"agent","nodes":[{"id":"start","type":"trigger"},
		{"id":"ask","type":"agent","data":{"provider":"openai","model":"m","prompt":"loop","maxTurns":1,"tools":[{"name":"t"}]}}],
		"edges":[{"from":"start","to":"ask"}]}`
	h := newHistory(t, testRun, wf, `{}`).resume("w")
	h.start("ask.turn[0]").complete("ask.turn[0]", `{"text":"","tool_calls":[{"id":"c1","name":"t","arguments":{}}]}`, nil)
	h.start("ask.turn[0].tool[0]").complete("ask.turn[0].tool[0]", `{}`, nil)
	f, ok := next(h).(engine.Fail)
	require.True(t, ok)
	require.Equal(t, engine.CodeMaxTurns, f.Code)
	require.Equal(t, "agent ask used all 1 turns without a final answer", f.Error)
}

// TestAgentMCPToolsAreJournaledOnTheFirstTurn: an agent's first turn
// names its MCP servers (AIInput.mcp) beside its own tools; the tools
// that turn offered (its output's mcp_tools) are what every later turn
// offers, also after a resume, and a call of one is a tool step with its
// server (ToolInput.mcp).
func TestAgentMCPToolsAreJournaledOnTheFirstTurn(t *testing.T) {
	t.Parallel()
	wf := `{"name":"agent","nodes":[{"id":"start","type":"trigger"},
		{"id":"ask","type":"agent","data":{"provider":"openai","model":"m","prompt":"p","maxTurns":3,
		 "tools":[{"name":"weather"},{"mcp":"tickets","allow":["create_ticket"]},{"mcp":"github"}]}}],
		"edges":[{"from":"start","to":"ask"}]}`
	h := newHistory(t, testRun, wf, `{}`).resume("w")
	var in engine.AIInput
	require.NoError(t, json.Unmarshal(h.plan("ask.turn[0]").Input, &in))
	require.Equal(t, []provider.Tool{{Name: "weather"}}, in.Tools)
	require.Equal(t, []workflow.MCPSource{{Server: "tickets", Allow: []string{"create_ticket"}}, {Server: "github"}}, in.MCP)
	h.start("ask.turn[0]").complete("ask.turn[0]", `{"text":"","tool_calls":[{"id":"c1","name":"create_ticket","arguments":{"title":"t"}}],
		"mcp_tools":[{"server":"tickets","name":"create_ticket","description":"d","parameters":{"type":"object"}},{"server":"github","name":"create_issue"}]}`, nil)
	require.JSONEq(t, `{"tool":"create_ticket","input":{"title":"t"},"tool_call_id":"c1","mcp":"tickets"}`, string(h.plan("ask.turn[0].tool[0]").Input))
	h.start("ask.turn[0].tool[0]").complete("ask.turn[0].tool[0]", `{"content":[]}`, nil)
	h.resume("w2")
	in = engine.AIInput{}
	require.NoError(t, json.Unmarshal(h.plan("ask.turn[1]").Input, &in))
	require.Empty(t, in.MCP, "a later turn lists nothing")
	require.Equal(t, []provider.Tool{{Name: "weather"}, {Name: "create_ticket", Description: "d", Parameters: json.RawMessage(`{"type":"object"}`)},
		{Name: "create_issue"}}, in.Tools)
}
