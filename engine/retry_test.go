package engine_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/workflow"
)

// nodeWithRetry parses a one-step workflow whose ai-step has retry (a JSON
// object, or "" for none) and returns the step's node.
func nodeWithRetry(t *testing.T, retry string) *workflow.Node {
	t.Helper()
	data := `{"provider":"openai","model":"m","prompt":"p"}`
	if retry != "" {
		data = `{"provider":"openai","model":"m","prompt":"p","retry":` + retry + `}`
	}
	wf, err := workflow.Parse([]byte(fmt.Sprintf(`{"name":"r","nodes":[{"id":"start","type":"trigger"},
		{"id":"s","type":"ai-step","data":%s}],"edges":[{"from":"start","to":"s"}]}`, data)))
	require.NoError(t, err)
	n, ok := wf.Node("s")
	require.True(t, ok)
	return n
}

func TestRetryDecision(t *testing.T) {
	t.Parallel()
	const three = `{"maxAttempts":3,"backoffMs":500,"retryableClasses":["llm","timeout"]}`
	tests := []struct {
		name      string
		retry     string
		attempt   int
		tries     int
		classes   []string
		retryable bool
		unknown   bool

		want        bool
		wantAttempt int
		wantOf      int
	}{
		{"no policy: one try", "", 1, 0, []string{"llm"}, true, false, false, 1, 1},
		{"maxAttempts 1", `{"maxAttempts":1,"retryableClasses":["any"]}`, 1, 0, []string{"llm"}, true, false, false, 1, 1},
		{"no classes: nothing retries", `{"maxAttempts":3}`, 1, 0, []string{"llm"}, true, false, false, 1, 3},
		{"first failure: next attempt", three, 1, 0, []string{"llm"}, true, false, true, 2, 3},
		{"second failure: next attempt", three, 2, 1, []string{"llm"}, true, false, true, 3, 3},
		{"third failure: exhausted", three, 3, 2, []string{"llm"}, true, false, false, 3, 3},
		{"unknown outcome keeps the attempt", three, 1, 0, []string{"timeout", "llm"}, true, true, true, 1, 3},
		{"unknown outcome after a retry", three, 2, 1, []string{"timeout"}, true, true, true, 2, 3},
		{"unknown outcomes use up tries", three, 1, 2, []string{"timeout"}, true, true, false, 1, 3},
		{"permanent error never retries", three, 1, 0, []string{"llm"}, false, false, false, 1, 3},
		{"permanent even with any", `{"maxAttempts":5,"retryableClasses":["any"]}`, 1, 0, []string{"llm"}, false, true, false, 1, 5},
		{"class not in policy", three, 1, 0, []string{"connector"}, true, false, false, 1, 3},
		{"no class at all", three, 1, 0, nil, true, false, false, 1, 3},
		{"any matches every class", `{"maxAttempts":2,"retryableClasses":["any"]}`, 1, 0, []string{"tool"}, true, false, true, 2, 2},
		{"any matches an unknown class", `{"maxAttempts":2,"retryableClasses":["any"]}`, 1, 0, []string{"weird"}, true, false, true, 2, 2},
		{"second class matches", `{"maxAttempts":2,"retryableClasses":["timeout"]}`, 1, 0, []string{"llm", "timeout"}, true, true, true, 1, 2},
		{"first class matches", `{"maxAttempts":2,"retryableClasses":["connector"]}`, 1, 0, []string{"connector", "timeout"}, true, false, true, 2, 2},
		{"none of several match", `{"maxAttempts":4,"retryableClasses":["tool","connector"]}`, 1, 0, []string{"timeout", "llm"}, true, false, false, 1, 4},
		{"high attempt from earlier retries", `{"maxAttempts":10,"retryableClasses":["llm"]}`, 7, 6, []string{"llm"}, true, false, true, 8, 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := engine.StepPlan{StepID: "s", NodeID: "s", Node: nodeWithRetry(t, tt.retry), Attempt: tt.attempt, Tries: tt.tries}
			retry, attempt, of := engine.RetryDecision(p, tt.classes, tt.retryable, tt.unknown)
			require.Equal(t, tt.want, retry, "retry")
			require.Equal(t, tt.wantAttempt, attempt, "attempt")
			require.Equal(t, tt.wantOf, of, "of")
		})
	}
}

func TestRetryDecisionClasses(t *testing.T) {
	t.Parallel()
	// Every class docs/architecture.md §6.3 names is accepted by a policy
	// naming it.
	for _, c := range []string{event.ClassTimeout, event.ClassLLM, event.ClassConnector, event.ClassTool} {
		p := engine.StepPlan{Node: nodeWithRetry(t, `{"maxAttempts":2,"retryableClasses":["`+c+`"]}`), Attempt: 1}
		retry, _, _ := engine.RetryDecision(p, []string{c}, true, false)
		require.True(t, retry, c)
	}
}

func TestNextModel(t *testing.T) {
	t.Parallel()
	llm := engine.StepPlan{Exec: engine.ExecLLM, Models: 3}
	for _, tt := range []struct {
		name          string
		plan          engine.StepPlan
		retry, outage bool
		want          int
		ok            bool
	}{
		{"policy spent", llm, false, false, 1, true},
		{"retried on its model", llm, true, false, 0, false},
		{"outage moves at once", llm, true, true, 1, true},
		{"second to third", engine.StepPlan{Exec: engine.ExecLLM, Models: 3, Fallback: 1}, false, false, 2, true},
		{"the last has no next", engine.StepPlan{Exec: engine.ExecLLM, Models: 3, Fallback: 2}, false, true, 2, false},
		{"one model", engine.StepPlan{Exec: engine.ExecLLM, Models: 1}, false, true, 0, false},
		{"not an LLM step", engine.StepPlan{Exec: engine.ExecTool, Models: 3}, false, true, 0, false},
	} {
		got, ok := engine.NextModel(tt.plan, tt.retry, tt.outage)
		require.Equal(t, tt.ok, ok, tt.name)
		require.Equal(t, tt.want, got, tt.name)
	}
}

// TestFallbackFold: a step_retrying that moves to the next model plans the
// next attempt on it, with the retry policy's tries counted afresh.
func TestFallbackFold(t *testing.T) {
	t.Parallel()
	wf := `{"name":"f","nodes":[{"id":"start","type":"trigger"},
		{"id":"a","type":"ai-step","data":{"model":["openai/gpt-4o","anthropic/claude-sonnet-4-5"],"prompt":"hi",
		 "retry":{"maxAttempts":2,"retryableClasses":["llm"]}}}],"edges":[{"from":"start","to":"a"}]}`
	h := newStarted(t, testRun, wf, `{}`, nil).resume("w")
	p := h.plan("a")
	require.Equal(t, 0, p.Fallback)
	require.Equal(t, 2, p.Models)
	require.Contains(t, string(p.Input), `"provider":"openai","model":"gpt-4o"`)
	h.start("a")
	h.append(event.StepRetrying, "a", 1, event.StepRetryingData{Attempt: 1, Of: 2, Error: "429", Class: event.ClassLLM})
	p = h.plan("a")
	require.Equal(t, 1, p.Tries, "one try on gpt-4o")
	h.start("a")
	h.append(event.StepRetrying, "a", 1, event.StepRetryingData{Attempt: 2, Of: 2, Error: "429", Class: event.ClassLLM, Fallback: 1})
	p = h.plan("a")
	require.Equal(t, 2, p.Attempt)
	require.Equal(t, 1, p.Fallback)
	require.Zero(t, p.Tries, "the policy starts again on the next model")
	require.Contains(t, string(p.Input), `"provider":"anthropic","model":"claude-sonnet-4-5"`)
	h.start("a")
	require.Equal(t, "anthropic/claude-sonnet-4-5", h.st.Steps["a"].AttemptState(2).Model)
	require.Equal(t, "openai/gpt-4o", h.st.Steps["a"].AttemptState(1).Model)
}
