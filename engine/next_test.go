package engine_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/workflow"
)

const testRun = "run_01JNB6W2G8Z4K0S1C5V7X9D3T0"

func next(h *history) engine.Action { return engine.Next(h.st.Workflow, h.st, h.now) }

// driveAll runs h to its end the way a worker would, completing each
// planned step with outputs[step] (condition nodes compute their own),
// and returns the steps in the order they ran and the final action.
func driveAll(t *testing.T, h *history, outputs map[string]string) ([]string, engine.Action) {
	t.Helper()
	var ran []string
	for range 50 {
		a := next(h)
		rs, ok := a.(engine.RunStep)
		if !ok {
			return ran, a
		}
		id := rs.Plan.StepID
		ran = append(ran, id)
		if rs.Plan.Pure {
			h.pure(id)
			continue
		}
		out, ok := outputs[id]
		require.True(t, ok, "no output for step %s", id)
		h.start(id).complete(id, out, nil)
	}
	require.FailNow(t, "run does not end")
	return nil, nil
}

func TestNextSequential(t *testing.T) {
	t.Parallel()
	h := newHistory(t, testRun, wfSummarise, inputSummarise)
	// Next does not need a drive to have begun.
	require.Equal(t, "draft", h.plan("draft").StepID)
	h.resume("worker-a")

	p := h.plan("draft")
	require.Equal(t, 1, p.Attempt)
	require.Zero(t, p.Tries)
	require.False(t, p.Started)
	require.False(t, p.Pure)
	require.Equal(t, "ai-step", p.NodeType)
	require.Equal(t, "draft", p.NodeID)
	require.Equal(t, "draft", p.Node.ID)
	require.Equal(t, event.IdempotencyKey(testRun, "draft", 1), p.Key)
	require.JSONEq(t, `{"provider":"openai","model":"gpt-4o-mini","messages":[{"role":"user",
		"content":"Summarise: PAL journals every step of an agent run to JetStream, so a crash loses nothing."}],
		"maxTokens":4096}`, string(p.Input), "a call always sends a cap")

	h.start("draft")
	// A started step is the one to resume, not the next one.
	require.True(t, h.plan("draft").Started)
	h.complete("draft", `{"text":"short"}`, nil)

	p = h.plan("review")
	require.JSONEq(t, `{"provider":"anthropic","model":"claude-sonnet-4-5","system":"You are a careful editor.",
		"messages":[{"role":"user","content":"Check this summary: short"}],"maxTokens":4096}`, string(p.Input))
	h.start("review").complete("review", `{"text":"fine"}`, nil)

	p = h.plan("publish")
	require.JSONEq(t, `{"provider":"openai","model":"gpt-4o-mini","maxTokens":32,"temperature":0.2,
		"messages":[{"role":"system","content":"Write a headline for engineers."},{"role":"user","content":"fine"}]}`, string(p.Input))
	h.start("publish").complete("publish", `{"text":"Headline"}`, nil)

	// Nothing left: the run succeeds with the last step's output.
	require.Equal(t, engine.Complete{Output: json.RawMessage(`{"text":"Headline"}`)}, next(h))
	h.finish()
	require.Equal(t, engine.Done{Status: engine.StatusSucceeded}, next(h))
}

func TestNextRunsFirstIncompleteNode(t *testing.T) {
	t.Parallel()
	// A crash after review completed: draft and review are skipped and
	// their outputs reused.
	h := summariseRun(t, testRun)
	h.llm("review", "Fine.", "claude-sonnet-4-5", 10, 2)
	h.wait(10 * time.Second).resume("worker-b")
	p := h.plan("publish")
	require.False(t, p.Started)
	require.Contains(t, string(p.Input), `"content":"Fine."`)
}

func TestNextResumesStartedStep(t *testing.T) {
	t.Parallel()
	h := summariseRun(t, testRun)
	// The journaled input is what the step acts on after a crash, even if
	// rendering now would give something else (say, a worker of another
	// version wrote it).
	journaled := json.RawMessage(`{"provider":"anthropic","model":"claude-sonnet-4-5","messages":[{"role":"user","content":"as journaled"}]}`)
	key := event.IdempotencyKey(testRun, "review", 1)
	h.append(event.StepStarted, "review", 1, event.StepStartedData{NodeID: "review", NodeType: "ai-step", Input: journaled, IdempotencyKey: key})
	h.wait(15 * time.Second).resume("worker-b")

	p := h.plan("review")
	require.True(t, p.Started)
	require.Equal(t, 1, p.Attempt)
	require.Equal(t, key, p.Key, "a resumed attempt keeps its idempotency key")
	require.JSONEq(t, string(journaled), string(p.Input))
	require.Zero(t, p.NotBefore)

	// Resumed again and again: still the same attempt and key.
	h.wait(15 * time.Second).resume("worker-c")
	require.Equal(t, p, h.plan("review"))
}

func TestNextAfterRetry(t *testing.T) {
	t.Parallel()
	h := newHistory(t, testRun, wfSummarise, inputSummarise).resume("worker-a").start("draft")
	first := h.plan("draft")

	// Unknown outcome: same attempt, same key, after the delay.
	require.True(t, h.failTry("draft", "timeout", event.ClassTimeout, true, true, 500*time.Millisecond))
	retryTS := h.evs[len(h.evs)-1].TS
	p := h.plan("draft")
	require.Equal(t, 1, p.Attempt)
	require.Equal(t, first.Key, p.Key)
	require.Equal(t, 1, p.Tries)
	require.False(t, p.Started, "a retry is a new try: it journals step_started again")
	require.Equal(t, retryTS.Add(500*time.Millisecond), p.NotBefore)
	require.Equal(t, first.Input, p.Input)

	// A crash during the backoff does not lose the retry's schedule.
	h.resume("worker-b")
	require.Equal(t, p, h.plan("draft"))

	// Definite failure: the next attempt, a new key.
	h.start("draft")
	require.True(t, h.failTry("draft", "503", event.ClassLLM, true, false, 2*time.Second))
	retryTS = h.evs[len(h.evs)-1].TS
	p = h.plan("draft")
	require.Equal(t, 2, p.Attempt)
	require.Equal(t, 2, p.Tries)
	require.Equal(t, event.IdempotencyKey(testRun, "draft", 2), p.Key)
	require.NotEqual(t, first.Key, p.Key)
	require.Equal(t, retryTS.Add(2*time.Second), p.NotBefore)

	// The third try is the last the policy allows.
	h.start("draft")
	require.False(t, h.failTry("draft", "503 again", event.ClassLLM, true, false, 0))
	require.Equal(t, engine.Fail{Code: event.CodeStepFailed, StepID: "draft", Error: "step draft failed: 503 again"}, next(h))
}

func TestNextRetryClearsClaim(t *testing.T) {
	t.Parallel()
	// A delivery that failed with an unknown outcome and was retried by
	// policy may be sent again, with the same key.
	h := notifyRun(t, testRun).claim("notify")
	require.True(t, h.failTry("notify", "connection reset", event.ClassConnector, true, true, 0))
	p := h.plan("notify")
	require.False(t, p.Claimed)
	require.False(t, p.Delivered)
	require.Equal(t, event.IdempotencyKey(testRun, "notify", 1), p.Key)
	h.start("notify")
	p = h.plan("notify")
	require.True(t, p.Started)
	require.False(t, p.Claimed)
}

func TestNextFailedStepFailsRun(t *testing.T) {
	t.Parallel()
	h := summariseRun(t, testRun).start("review")
	require.False(t, h.failTry("review", "anthropic: 400 prompt is too long", event.ClassLLM, false, false, 0))
	a := next(h)
	require.Equal(t, engine.Fail{Code: event.CodeStepFailed, StepID: "review",
		Error: "step review failed: anthropic: 400 prompt is too long"}, a)
	// Asking again does not change the answer.
	require.Equal(t, a, next(h))
}

func TestNextDoneWhenEnded(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		end  func(h *history)
		want engine.Status
	}{
		{"succeeded", func(h *history) {
			h.llm("review", "ok", "m", 1, 1).llm("publish", "ok", "m", 1, 1).finish()
		}, engine.StatusSucceeded},
		{"failed", func(h *history) {
			h.append(event.RunFailed, "", 0, event.RunFailedData{Code: event.CodeInternal, Error: "x"})
		}, engine.StatusFailed},
		{"cancelled", func(h *history) {
			h.append(event.RunCancelled, "", 0, event.RunCancelledData{})
		}, engine.StatusCancelled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := summariseRun(t, testRun)
			tt.end(h)
			// A re-drive of an ended run is a no-op.
			require.Equal(t, engine.Done{Status: tt.want}, next(h))
			require.Equal(t, engine.Done{Status: tt.want}, engine.Next(nil, h.st, h.now), "no workflow needed to know")
		})
	}
}

const wfBranches = `{
  "name": "branches",
  "nodes": [
    {"id": "start", "type": "trigger"},
    {"id": "classify", "type": "ai-step", "data": {"provider": "openai", "model": "m", "prompt": "{{input.text}}"}},
    {"id": "urgent", "type": "tool", "data": {"tool": "page"}},
    {"id": "routine", "type": "tool", "data": {"tool": "reply"}},
    {"id": "page_log", "type": "tool", "data": {"tool": "log", "input": {"paged": "{{steps.urgent.output}}"}}},
    {"id": "log", "type": "tool", "data": {"tool": "log", "input": {"label": "{{steps.classify.output.text}}"}}}
  ],
  "edges": [
    {"from": "start", "to": "classify"},
    {"from": "classify", "to": "urgent", "condition": "steps.classify.output.text == 'urgent'"},
    {"from": "classify", "to": "routine", "condition": "steps.classify.output.text == 'routine'"},
    {"from": "urgent", "to": "page_log"},
    {"from": "page_log", "to": "log"},
    {"from": "routine", "to": "log"}
  ]
}`

func TestNextConditionalEdges(t *testing.T) {
	t.Parallel()
	outputs := map[string]string{
		"urgent": `{"paged":true}`, "routine": `{"replied":true}`, "page_log": `"noted"`, "log": `{"logged":1}`,
		"escalate": `{"text":"paged"}`, "reply": `{"text":"answered"}`,
	}
	tests := []struct {
		name   string
		wf     string
		label  string
		ran    []string
		output string
	}{
		{"true path and its chain", wfBranches, "urgent", []string{"classify", "urgent", "page_log", "log"}, `{"logged":1}`},
		// urgent is dead, so is page_log after it; log joins the live branch.
		{"false path, dead chain, join", wfBranches, "routine", []string{"classify", "routine", "log"}, `{"logged":1}`},
		// Every branch dead: so is the join; the run ends with the last
		// completed step's output.
		{"all paths dead", wfBranches, "spam", []string{"classify"}, `{"text":"spam"}`},
		{"diamond, left", wfTriage, "urgent", []string{"classify", "escalate", "log"}, `{"logged":1}`},
		{"diamond, right", wfTriage, "routine", []string{"classify", "reply", "log"}, `{"logged":1}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newHistory(t, testRun, tt.wf, `{"text":"x","ticket":{"id":1,"body":"b"}}`).resume("worker-a")
			outs := map[string]string{"classify": `{"text":"` + tt.label + `"}`}
			for k, v := range outputs {
				outs[k] = v
			}
			ran, end := driveAll(t, h, outs)
			require.Equal(t, tt.ran, ran)
			c, ok := end.(engine.Complete)
			require.True(t, ok, "%#v", end)
			require.JSONEq(t, tt.output, string(c.Output))
			for _, id := range h.st.Workflow.Order() {
				if !contains(ran, id) {
					_, ok := h.st.Steps[id]
					require.False(t, ok, "dead step %s has no journal entries", id)
				}
			}
		})
	}
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

func TestNextEdgeConditionError(t *testing.T) {
	t.Parallel()
	// The condition names a string, not a boolean: Fail, naming the step
	// whose edge it is.
	wf := strings.Replace(wfBranches, `"condition": "steps.classify.output.text == 'routine'"`,
		`"condition": "steps.classify.output.text"`, 1)
	h := newHistory(t, testRun, wf, `{"text":"x"}`).resume("worker-a")
	h.start("classify").complete("classify", `{"text":"routine"}`, nil)
	a := next(h)
	f, ok := a.(engine.Fail)
	require.True(t, ok, "%#v", a)
	require.Equal(t, event.CodeStepFailed, f.Code)
	require.Equal(t, "routine", f.StepID)
	require.Contains(t, f.Error, "classify→routine")
	require.Contains(t, f.Error, "want a boolean")
}

func TestNextConditionNode(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		expr   string
		score  string
		result string
		ran    []string
	}{
		{"true", "steps.sentiment.output.score > 0.8", "0.92", `true`, []string{"sentiment", "check", "publish"}},
		{"false", "steps.sentiment.output.score > 0.8", "0.31", `false`, []string{"sentiment", "check", "hold"}},
		{"boundary", "steps.sentiment.output.score > 0.8", "0.8", `false`, []string{"sentiment", "check", "hold"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			wf := strings.Replace(wfGate, "steps.sentiment.output.score > 0.8", tt.expr, 1)
			h := newHistory(t, testRun, wf, inputGate).resume("worker-a")
			h.start("sentiment").complete("sentiment", `{"score":`+tt.score+`}`, nil)
			p := h.plan("check")
			require.True(t, p.Pure)
			require.Equal(t, "condition", p.NodeType)
			require.JSONEq(t, `{"result":`+tt.result+`}`, string(p.Output))
			require.JSONEq(t, `{"expression":"`+tt.expr+`"}`, string(p.Input))
			ran, end := driveAll(t, h, map[string]string{"publish": `{"delivery":"delivered"}`, "hold": `{"queued":true}`})
			require.Equal(t, tt.ran[1:], ran)
			require.IsType(t, engine.Complete{}, end)
		})
	}
}

func TestNextConditionNodeValue(t *testing.T) {
	t.Parallel()
	// A condition node may compute any value; its edges branch on it.
	wf := `{"name":"route","nodes":[{"id":"start","type":"trigger"},
	  {"id":"route","type":"condition","data":{"expression":"input.priority >= 3 ? 'high' : 'low'"}},
	  {"id":"high","type":"tool","data":{"tool":"page"}},
	  {"id":"low","type":"tool","data":{"tool":"mail"}}],
	  "edges":[{"from":"start","to":"route"},
	    {"from":"route","to":"high","condition":"steps.route.output.result == 'high'"},
	    {"from":"route","to":"low","condition":"steps.route.output.result == 'low'"}]}`
	h := newHistory(t, testRun, wf, `{"priority":4}`).resume("worker-a")
	p := h.plan("route")
	require.JSONEq(t, `{"result":"high"}`, string(p.Output))
	h.pure("route")
	h.plan("high")

	// A condition node whose expression fails at run time fails the run.
	wf = strings.Replace(wf, "input.priority >= 3", "input.priority.level >= 3", 1)
	h = newHistory(t, testRun, wf, `{"priority":4}`).resume("worker-a")
	a := next(h)
	f, ok := a.(engine.Fail)
	require.True(t, ok, "%#v", a)
	require.Equal(t, event.CodeStepFailed, f.Code)
	require.Equal(t, "route", f.StepID)
	require.Contains(t, f.Error, "step route: expression")
}

func TestNextTemplateErrorFailsNamingStep(t *testing.T) {
	t.Parallel()
	h := newHistory(t, testRun, wfSummarise, inputSummarise).resume("worker-a")
	// draft's output has no text field: review's prompt cannot render.
	h.start("draft").complete("draft", `{"summary":"wrong shape"}`, nil)
	a := next(h)
	f, ok := a.(engine.Fail)
	require.True(t, ok, "%#v", a)
	require.Equal(t, event.CodeStepFailed, f.Code)
	require.Equal(t, "review", f.StepID)
	require.Contains(t, f.Error, "step review: prompt:")
	require.Contains(t, f.Error, `has no field "text"`)
}

func TestNextInvalidWorkflow(t *testing.T) {
	t.Parallel()
	h := newHistoryRaw(t, testRun, json.RawMessage(wfInvalid), "needs-approval", `{}`).resume("worker-a")
	require.Nil(t, h.st.Workflow)
	require.Error(t, h.st.WorkflowErr)
	f, ok := next(h).(engine.Fail)
	require.True(t, ok)
	require.Equal(t, event.CodeInvalidWorkflow, f.Code)
	require.Contains(t, f.Error, "workflow snapshot does not parse")
	require.Contains(t, f.Error, `template {{steps.nope.output}}: no node "nope"`)

	// JSON, but not a workflow.
	h = newHistoryRaw(t, testRun, json.RawMessage(`["start","draft"]`), "x", `{}`)
	require.Error(t, h.st.WorkflowErr)
	require.Equal(t, event.CodeInvalidWorkflow, next(h).(engine.Fail).Code)

	// No workflow at all.
	h = newHistoryRaw(t, testRun, nil, "", `{}`)
	require.Equal(t, engine.Fail{Code: event.CodeInvalidWorkflow, Error: "run has no workflow"}, next(h))
}

func TestNextTriggerOnly(t *testing.T) {
	t.Parallel()
	const wf = `{"name":"echo","nodes":[{"id":"start","type":"trigger"}],"edges":[]}`
	h := newHistory(t, testRun, wf, `{"a":[1,2]}`).resume("worker-a")
	require.Equal(t, engine.Complete{Output: json.RawMessage(`{"a":[1,2]}`)}, next(h))

	h = newHistory(t, testRun, wf, ``)
	require.Equal(t, engine.Complete{Output: json.RawMessage(`null`)}, next(h))
}

// TestNextUsesGivenWorkflow: Next works from the workflow it is given,
// also when the journal holds no snapshot (a run started from a stored
// workflow by reference).
func TestNextUsesGivenWorkflow(t *testing.T) {
	t.Parallel()
	wf, err := workflow.Parse([]byte(`{"name":"by-ref","nodes":[
	  {"id":"start","type":"trigger"},
	  {"id":"check","type":"condition","data":{"expression":"steps.start.output.n > 1"}},
	  {"id":"draft","type":"ai-step","data":{"provider":"openai","model":"m","prompt":"n is {{steps.start.output.n}}"}}],
	  "edges":[{"from":"start","to":"check"},{"from":"check","to":"draft","condition":"steps.check.output.result"}]}`))
	require.NoError(t, err)
	h := newHistoryRaw(t, testRun, nil, "", `{"n":2}`).resume("worker-a")
	require.Nil(t, h.st.Workflow)

	a := engine.Next(wf, h.st, h.now)
	rs, ok := a.(engine.RunStep)
	require.True(t, ok, "%#v", a)
	require.True(t, rs.Plan.Pure)
	require.JSONEq(t, `{"result":true}`, string(rs.Plan.Output))
	h.append(event.StepStarted, "check", 1, event.StepStartedData{NodeID: "check", NodeType: "condition",
		Input: rs.Plan.Input, IdempotencyKey: rs.Plan.Key})
	h.append(event.StepCompleted, "check", 1, event.StepCompletedData{Output: rs.Plan.Output})

	a = engine.Next(wf, h.st, h.now)
	rs, ok = a.(engine.RunStep)
	require.True(t, ok, "%#v", a)
	require.Equal(t, "draft", rs.Plan.StepID)
	require.Contains(t, string(rs.Plan.Input), `"content":"n is 2"`)
}

// TestTemplateEnv: a step's templates see the run input, the trigger's
// output (the input) and the outputs of completed steps, as decoded JSON.
func TestTemplateEnv(t *testing.T) {
	t.Parallel()
	const wf = `{"name":"env","nodes":[{"id":"start","type":"trigger"},
	  {"id":"draft","type":"tool","data":{"tool":"echo"}},
	  {"id":"use","type":"tool","data":{"tool":"echo","input":{"s":"{{steps.draft.output.text}}/{{steps.start.output.text}}/{{input.n}}","tokens":"{{steps.draft.output.tokens}}"}}}],
	  "edges":[{"from":"start","to":"draft"},{"from":"draft","to":"use"}]}`
	h := newHistory(t, testRun, wf, `{"text":"hello","n":1.5}`).resume("worker-a")
	h.start("draft").complete("draft", `{"text":"hi","tokens":12}`, nil)
	require.JSONEq(t, `{"tool":"echo","input":{"s":"hi/hello/1.5","tokens":12}}`, string(h.plan("use").Input))

	// A step's output is re-read when the journal is folded again.
	st, err := engine.Fold(h.events())
	require.NoError(t, err)
	require.Equal(t, map[string]any{"text": "hi", "tokens": json.Number("12")}, st.Steps["draft"].OutputValue())
	require.Equal(t, map[string]any{"text": "hello", "n": json.Number("1.5")}, st.Input())
}

// TestNextContextInterruptsConditions: the context reaches every
// condition Next evaluates, so an ended drive does not keep evaluating.
func TestNextContextInterruptsConditions(t *testing.T) {
	t.Parallel()
	h := newHistory(t, "run_ctx", `{"name":"c","nodes":[{"id":"start","type":"trigger"},
		{"id":"a","type":"tool","data":{"tool":"echo","input":{}}}],
		"edges":[{"from":"start","to":"a","condition":"1 in 1..3"}]}`, `{}`).resume("w1")
	_, ok := engine.Next(h.st.Workflow, h.st, h.now).(engine.RunStep)
	require.True(t, ok, "the condition holds")

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	f, ok := engine.NextContext(ctx, h.st.Workflow, h.st, h.now).(engine.Fail)
	require.True(t, ok, "a cancelled context stops the evaluation")
	require.Contains(t, f.Error, "context canceled")
}
