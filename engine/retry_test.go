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
