package workers_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/provider"
	"github.com/palrun/pal/provider/providertest"
	"github.com/palrun/pal/runs"
	"github.com/palrun/pal/workers"
)

func approvalWorkflow(extra string) string {
	return fmt.Sprintf(`{"name":"ship","nodes":[{"id":"start","type":"trigger"},
		{"id":"draft","type":"tool","data":{"tool":"echo","input":{"v":"{{input.v}}"}}},
		{"id":"ok","type":"approval","data":{"prompt":"Ship {{steps.draft.output.v}}?"%s}},
		{"id":"ship","type":"tool","data":{"tool":"echo","input":{"shipped":"{{steps.draft.output.v}}"}}}],
		"edges":[{"from":"start","to":"draft"},{"from":"draft","to":"ok"},{"from":"ok","to":"ship"}]}`, extra)
}

func (b *bundle) waitStatus(t *testing.T, runID string, want engine.Status) *runs.RunView {
	t.Helper()
	var v *runs.RunView
	require.Eventually(t, func() bool {
		var err error
		v, err = runs.New(b.Store).Get(context.Background(), runID)
		return err == nil && v.Status == want
	}, 30*time.Second, 10*time.Millisecond, "run %s never %s", runID, want)
	return v
}

func (b *bundle) settled(t *testing.T, runID string) {
	t.Helper()
	ctx := context.Background()
	require.Eventually(t, func() bool {
		h, err := b.Leases.Holder(ctx, runID)
		p, perr := b.Store.WorkPending(ctx, "", runID)
		return err == nil && perr == nil && h == "" && !p
	}, 30*time.Second, 10*time.Millisecond, "run %s still leased or queued", runID)
}

func TestApprovalParksAndApproveFinishes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.worker(t, "w1", nil)
	ctx := context.Background()
	runID := b.Start(t, approvalWorkflow(""), `{"v":"1.2"}`)
	b.waitStatus(t, runID, engine.StatusWaiting)
	b.settled(t, runID) // parked: work acked, lease released, no slot held

	// Refusals write nothing.
	before := len(b.Events(t, runID))
	require.ErrorIs(t, runs.New(b.Store).Approve(ctx, runs.ApproveCommand{RunID: runID, StepID: "draft", Decision: "approve", Approver: "ana"}), runs.ErrNotWaiting)
	var ie *runs.InputError
	require.ErrorAs(t, runs.New(b.Store).Approve(ctx, runs.ApproveCommand{RunID: runID, StepID: "ok", Decision: "approve"}), &ie)
	require.Len(t, b.Events(t, runID), before)

	require.NoError(t, runs.New(b.Store).Approve(ctx, runs.ApproveCommand{RunID: runID, StepID: "ok", Decision: "approve", Approver: "ana", Comment: "go"}))
	// A second decision is refused: as not waiting while the run goes on,
	// or as finished if it has already ended.
	err := runs.New(b.Store).Approve(ctx, runs.ApproveCommand{RunID: runID, StepID: "ok", Decision: "reject", Approver: "bo"})
	require.True(t, errors.Is(err, runs.ErrNotWaiting) || errors.Is(err, runs.ErrRunFinished), "decided once: %v", err)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, runID).Kind)
	evs := b.Events(t, runID)
	dec := find(evs, event.ApprovalReceived, "ok")
	require.Len(t, dec, 1)
	require.Equal(t, "ana", dec[0].WorkerID)
	out := data[event.StepCompletedData](t, find(evs, event.StepCompleted, "ok")[0]).Output
	require.JSONEq(t, `{"approved":true,"decision":"approve","approver":"ana","comment":"go","timed_out":false}`, string(out))
	require.Len(t, find(evs, event.StepWaiting, "ok"), 1)
}

func TestEarlyApprovalAppliesWhenTheRunArrives(t *testing.T) {
	t.Parallel()
	b := setup(t)
	hold := b.LLM.Hold(func(c providertest.Call) bool { return true })
	b.worker(t, "w1", nil)
	ctx := context.Background()
	wf := `{"name":"early","nodes":[{"id":"start","type":"trigger"},
		{"id":"think","type":"ai-step","data":{"provider":"openai","model":"m","prompt":"think"}},
		{"id":"ok","type":"approval"},{"id":"done","type":"tool","data":{"tool":"echo"}}],
		"edges":[{"from":"start","to":"think"},{"from":"think","to":"ok"},{"from":"ok","to":"done"}]}`
	runID := b.Start(t, wf, `{}`)
	_, err := hold.Wait(ctxFor(t, 30*time.Second))
	require.NoError(t, err)
	// Decided while the run is still thinking: kept, and the drive that
	// conflicts with it folds it in and goes on.
	require.NoError(t, runs.New(b.Store).Approve(ctx, runs.ApproveCommand{RunID: runID, StepID: "ok", Decision: "approve", Approver: "early-bird"}))
	hold.Release()
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, runID).Kind)
	evs := b.Events(t, runID)
	require.Empty(t, find(evs, event.StepWaiting, ""), "the run never had to wait")
	require.Len(t, find(evs, event.RunResumed, ""), 1, "one drive, not interrupted by the decision")
}

func TestRejectionFailsAndTimeoutRoutes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.worker(t, "w1", nil)
	ctx := context.Background()
	runID := b.Start(t, approvalWorkflow(""), `{"v":"x"}`)
	b.waitStatus(t, runID, engine.StatusWaiting)
	require.NoError(t, runs.New(b.Store).Approve(ctx, runs.ApproveCommand{RunID: runID, StepID: "ok", Decision: "reject", Approver: "cy", Comment: "no"}))
	final := b.WaitEnd(t, runID)
	require.Equal(t, event.RunFailed, final.Kind)
	require.Equal(t, "step ok was rejected by cy: no", data[event.RunFailedData](t, final).Error)

	// A timeout routes along an edge (the durable timer wakes the run).
	wf := `{"name":"timeout","nodes":[{"id":"start","type":"trigger"},{"id":"ok","type":"approval","data":{"timeoutMs":1000}},
		{"id":"yes","type":"tool","data":{"tool":"echo","input":{"r":"yes"}}},{"id":"late","type":"tool","data":{"tool":"echo","input":{"r":"late"}}}],
		"edges":[{"from":"start","to":"ok"},{"from":"ok","to":"yes","condition":"steps.ok.output.approved"},
		{"from":"ok","to":"late","condition":"steps.ok.output.timed_out"}]}`
	runID = b.Start(t, wf, `{}`)
	b.waitStatus(t, runID, engine.StatusWaiting)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, runID).Kind)
	evs := b.Events(t, runID)
	require.Len(t, find(evs, event.StepCompleted, "late"), 1)
	require.Empty(t, find(evs, event.StepStarted, "yes"))
	require.JSONEq(t, `{"approved":false,"decision":"timeout","timed_out":true}`, string(data[event.StepCompletedData](t, find(evs, event.StepCompleted, "ok")[0]).Output))
}

func TestLoopOverItems(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.worker(t, "w1", nil)
	wf := `{"name":"each","nodes":[{"id":"start","type":"trigger"},
		{"id":"each","type":"loop","data":{"over":"{{input.xs}}","body":{"name":"one","nodes":[{"id":"start","type":"trigger"},
			{"id":"ask","type":"ai-step","data":{"provider":"openai","model":"m","prompt":"item {{input.item}} #{{input.index}}"}}],
			"edges":[{"from":"start","to":"ask"}]}}}],
		"edges":[{"from":"start","to":"each"}]}`
	runID := b.Start(t, wf, `{"xs":["a","b","c"]}`)
	final := b.WaitEnd(t, runID)
	require.Equal(t, event.RunSucceeded, final.Kind)
	var out struct {
		Iterations int `json:"iterations"`
		Results    []struct {
			Text string `json:"text"`
		} `json:"results"`
	}
	require.NoError(t, json.Unmarshal(data[event.RunSucceededData](t, final).Output, &out))
	require.Equal(t, 3, out.Iterations)
	require.Equal(t, "echo: item c #2", out.Results[2].Text)
	for i := range 3 {
		require.Equal(t, 1, b.LLM.Keys()[key(runID, fmt.Sprintf("each[%d].ask", i), 1)])
	}
}

func subagentWorkflow(depth int, leaf string) string {
	if depth == 0 {
		return leaf
	}
	return fmt.Sprintf(`{"name":"level-%d","nodes":[{"id":"start","type":"trigger"},
		{"id":"kid","type":"subagent","data":{"input":{"q":"{{input.q}}"},"workflow":%s}}],
		"edges":[{"from":"start","to":"kid"}]}`, depth, subagentWorkflow(depth-1, leaf))
}

const leafWorkflow = `{"name":"leaf","nodes":[{"id":"start","type":"trigger"},
	{"id":"answer","type":"tool","data":{"tool":"echo","input":{"answer":"{{input.q}}"}}}],"edges":[{"from":"start","to":"answer"}]}`

func TestSubagentRunsAChildOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.worker(t, "w1", nil)
	runID := b.Start(t, subagentWorkflow(1, leafWorkflow), `{"q":"42"}`)
	final := b.WaitEnd(t, runID)
	require.Equal(t, event.RunSucceeded, final.Kind)
	require.JSONEq(t, `{"answer":"42"}`, string(data[event.RunSucceededData](t, final).Output))
	child := event.ChildRunID(runID, "kid")
	cevs := b.Events(t, child)
	cd := data[event.RunCreatedData](t, cevs[0])
	require.Equal(t, runID, cd.ParentRunID)
	require.Equal(t, "kid", cd.ParentStepID)
	require.Equal(t, 1, cd.Depth)
	require.Equal(t, runID, cd.TriggerMeta["parent_run_id"])
	require.Equal(t, event.RunResumed, cevs[1].Kind, "the child is created and driven at once")
	require.Equal(t, event.RunSucceeded, cevs[len(cevs)-1].Kind)
	require.Len(t, find(b.Events(t, runID), event.ChildRunCreated, "kid"), 1)
}

func TestSubagentDepthLimitNamesTheChain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.worker(t, "w1", nil)
	runID := b.Start(t, subagentWorkflow(6, leafWorkflow), `{"q":"deep"}`)
	final := b.WaitEnd(t, runID)
	require.Equal(t, event.RunFailed, final.Kind)
	// Walk down to the run at depth 5, whose step refused a sixth level.
	id := runID
	var ids []string
	for range 5 {
		ids = append(ids, id)
		id = event.ChildRunID(id, "kid")
	}
	ids = append(ids, id)
	evs := b.Events(t, id)
	fd := data[event.RunFailedData](t, evs[len(evs)-1])
	require.Equal(t, event.CodeDepthExceeded, fd.Code)
	require.Equal(t, "step kid would start a subagent at depth 6, over the limit of 5 (chain: "+strings.Join(ids, " → ")+")", fd.Error)
	require.Contains(t, data[event.RunFailedData](t, final).Error, "child run")
}

func TestNestedApprovalThroughAChild(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.worker(t, "w1", nil)
	ctx := context.Background()
	child := strings.ReplaceAll(approvalWorkflow(""), "{{input.v}}", "{{input.q}}")
	runID := b.Start(t, subagentWorkflow(1, child), `{"q":"x"}`)
	b.waitStatus(t, runID, engine.StatusWaiting)
	childID := event.ChildRunID(runID, "kid")
	b.waitStatus(t, childID, engine.StatusWaiting)
	b.settled(t, runID)
	b.settled(t, childID)
	waits := find(b.Events(t, runID), event.StepWaiting, "kid")
	require.Len(t, waits, 1)
	require.Equal(t, event.WaitChild, data[event.StepWaitingData](t, waits[0]).Reason)

	require.NoError(t, runs.New(b.Store).Approve(ctx, runs.ApproveCommand{RunID: childID, StepID: "ok", Decision: "approve", Approver: "ana"}))
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, childID).Kind)
	final := b.WaitEnd(t, runID)
	require.Equal(t, event.RunSucceeded, final.Kind)
	require.JSONEq(t, `{"shipped":"x"}`, string(data[event.RunSucceededData](t, final).Output))
	require.Len(t, find(b.Events(t, runID), event.StepCompleted, "kid"), 1)
}

// agentResponder scripts a tool-using model: it asks for the weather tool
// until it has seen a tool result, then answers.
func agentResponder(c providertest.Call) providertest.Reply {
	last := c.Messages[len(c.Messages)-1]
	if last.Role != provider.RoleTool {
		return providertest.Reply{ToolCalls: []provider.ToolCall{{ID: "call_1", Name: "weather", Arguments: json.RawMessage(`{"city":"Oslo"}`)}}}
	}
	return providertest.Reply{Text: "It is " + last.Content}
}

func TestAgentLoopJournalsTurnsAndToolCalls(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.LLM.SetResponder(agentResponder)
	b.worker(t, "w1", map[string]workers.Tool{"weather": func(_ context.Context, in json.RawMessage) (json.RawMessage, error) {
		return json.RawMessage(`{"temp_c":3}`), nil
	}})
	for _, prov := range []string{"openai", "anthropic"} {
		wf := fmt.Sprintf(`{"name":"agent","nodes":[{"id":"start","type":"trigger"},
			{"id":"ask","type":"agent","data":{"provider":%q,"model":"m","prompt":"weather in {{input.city}}?",
			 "tools":[{"name":"weather","description":"current weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}]}}],
			"edges":[{"from":"start","to":"ask"}]}`, prov)
		runID := b.Start(t, wf, `{"city":"Oslo"}`)
		final := b.WaitEnd(t, runID)
		require.Equal(t, event.RunSucceeded, final.Kind, prov)
		require.JSONEq(t, `{"text":"It is {\"temp_c\":3}","turns":2}`, string(data[event.RunSucceededData](t, final).Output), prov)
		evs := b.Events(t, runID)
		for _, s := range []string{"ask.turn[0]", "ask.turn[0].tool[0]", "ask.turn[1]", "ask"} {
			require.Len(t, find(evs, event.StepCompleted, s), 1, "%s %s", prov, s)
		}
		require.Equal(t, 1, b.LLM.Keys()[key(runID, "ask.turn[0]", 1)])
		require.Equal(t, 1, b.LLM.Keys()[key(runID, "ask.turn[1]", 1)])
	}
}

func TestPlainLLMRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.worker(t, "w1", nil)
	res, err := runs.New(b.Store).Start(context.Background(), runs.StartCommand{Rights: runs.AllRights,
		LLM:   &runs.LLMSpec{Provider: "anthropic", Model: "claude-sonnet-4-5", System: "terse", Prompt: "hello {{input.name}}"},
		Input: json.RawMessage(`{"name":"pal"}`)})
	require.NoError(t, err)
	final := b.WaitEnd(t, res.RunID)
	require.Equal(t, event.RunSucceeded, final.Kind)
	evs := b.Events(t, res.RunID)
	require.Len(t, find(evs, event.StepCompleted, "llm"), 1)
	calls := b.LLM.CallsWithKey(key(res.RunID, "llm", 1))
	require.Len(t, calls, 1)
	require.Equal(t, "hello pal", calls[0].LastUser())

	_, err = runs.New(b.Store).Start(context.Background(), runs.StartCommand{Rights: runs.AllRights,
		Workflow: json.RawMessage(leafWorkflow), LLM: &runs.LLMSpec{Provider: "openai", Model: "m", Prompt: "x"}})
	var ie *runs.InputError
	require.ErrorAs(t, err, &ie)
}

// TestChildIsIndexedAndPricedAsItsParent: a child run is in PAL_INFLIGHT
// while it runs, as every run is, and leaves it when it ends; its
// run_created journals its parent's prices of its models, and its calls
// are charged at them, whatever the worker's own table says.
func TestChildIsIndexedAndPricedAsItsParent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	child := `{"name":"leaf","nodes":[{"id":"start","type":"trigger"},
		{"id":"think","type":"ai-step","data":{"provider":"openai","model":"house-model","prompt":"{{input.q}}"}}],
		"edges":[{"from":"start","to":"think"}]}`
	house := event.Price{InputPerMTok: 100, OutputPerMTok: 1000}
	runID := event.NewRunID()
	childID := event.ChildRunID(runID, "kid")
	hold := b.LLM.Hold(providertest.ByKey(key(childID, "think", 1)))
	b.worker(t, "w1", nil)
	_, err := runs.New(b.Store, runs.WithPrices(event.Prices{"house-model": house})).Start(ctx,
		runs.StartCommand{Rights: runs.AllRights, RunID: runID, Workflow: json.RawMessage(subagentWorkflow(1, child)), Input: json.RawMessage(`{"q":"two words"}`)})
	require.NoError(t, err)
	_, err = hold.Wait(ctx)
	require.NoError(t, err)
	inflight, err := b.Store.InflightRuns(ctx)
	require.NoError(t, err)
	require.Subset(t, runIDsOf(inflight), []string{runID, childID}, "the parent and its child, in flight")
	hold.Release()
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, runID).Kind)

	cevs := b.Events(t, childID)
	require.Equal(t, event.Prices{"house-model": house}, data[event.RunCreatedData](t, cevs[0]).Prices)
	u := data[event.StepCompletedData](t, find(cevs, event.StepCompleted, "think")[0]).Usage
	require.NotNil(t, u)
	require.False(t, u.CostUnknown, "priced with the journaled prices: the worker's table knows no house-model")
	require.InDelta(t, house.Cost(u.InputTokens, u.OutputTokens), u.CostUSD, 1e-12)
	require.Eventually(t, func() bool {
		left, err := b.Store.InflightRuns(ctx)
		return err == nil && !slices.Contains(runIDsOf(left), childID)
	}, 30*time.Second, 20*time.Millisecond, "the ended child leaves the index")
}
