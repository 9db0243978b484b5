package workflow_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/workflow"
)

// conditionWorkflow has a condition node and conditional edges over the
// steps of testEnv.
const conditionWorkflow = `{
  "name": "conditions",
  "nodes": [
    {"id": "start", "type": "trigger"},
    {"id": "draft", "type": "tool", "data": {"tool": "draft"}},
    {"id": "fetch", "type": "tool", "data": {"tool": "fetch"}},
    {"id": "raw", "type": "tool", "data": {"tool": "raw"}},
    {"id": "check", "type": "condition", "data": {"expression": "steps.draft.output.score > 0.5 ? 'good' : 'bad'"}},
    {"id": "good", "type": "tool", "data": {"tool": "x"}},
    {"id": "bad", "type": "tool", "data": {"tool": "x"}}
  ],
  "edges": [
    {"from": "start", "to": "draft"},
    {"from": "draft", "to": "fetch"},
    {"from": "fetch", "to": "raw"},
    {"from": "raw", "to": "check"},
    {"from": "check", "to": "good", "condition": "steps.check.output.result == 'good'"},
    {"from": "check", "to": "bad", "condition": "steps.check.output.result != 'good'"}
  ]
}`

func TestEdgeFires(t *testing.T) {
	t.Parallel()

	w := mustParse(t, conditionWorkflow)
	env := testEnv(t)
	tests := []struct {
		cond string
		want bool
	}{
		{"", true},
		{"steps.draft.output.score > 0.5", true},
		{"steps.draft.output.score > 0.95", false},
		{"input.n == 3 && input.n + 1 == 4", true},
		{"input.ratio < 0.3", true},
		{"input.big > 1e18", true},
		{"steps.raw.output.ok", true},
		{"steps.raw.output.list[1] == 2.5", true},
		{`len(input.tags) == 2 && "a" in input.tags`, true},
		{`input.user.name startsWith "A" and input.user.age >= 36`, true},
		{"steps.fetch.output.count == len(steps.fetch.output.items)", true},
		{`all(steps.fetch.output.items, .url matches "^https://")`, true},
		{"steps.review?.output?.ok ?? false", false},
		{"input.missing ?? true", true},
		{"input.nothing == nil", true},
		{`join(keys(input.user), ",") == "age,name"`, true},
		{`join(map(toPairs(input.user), string(#[0])), ",") == "age,name"`, true},
		{`values(input.user)[1] == "Ada"`, true},
		{`steps["dr" + "aft"].output.score > 0.9`, true},
		{`$env.input.n == 3`, true},
		{`toJSON(input.user) == '{\n  "age": 36,\n  "name": "Ada"\n}'`, true},
	}
	for _, tt := range tests {
		t.Run(tt.cond, func(t *testing.T) {
			t.Parallel()
			got, err := w.EdgeFires(workflow.Edge{From: "check", To: "good", Condition: tt.cond}, env)
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

func TestEdgeFiresErrors(t *testing.T) {
	t.Parallel()

	w := mustParse(t, conditionWorkflow)
	env := testEnv(t)
	tests := []struct {
		cond, want string
	}{
		{"input.n", `edge a→b: condition "input.n": result is 3 (number), want a boolean`},
		{"input.nothing", `edge a→b: condition "input.nothing": result is null, want a boolean`},
		{"input.user", `edge a→b: condition "input.user": result is {"age":36,"name":"Ada"} (object), want a boolean`},
		{"input.text > 1", `edge a→b: condition "input.text > 1": invalid operation: string > int at column 12`},
		{"now() > 0", `edge a→b: condition "now() > 0": unknown name now at column 1 (now is not available: a condition must give the same result when a run is replayed)`},
		{"input.", `edge a→b: condition "input.": unexpected end of expression at column 6`},
	}
	for _, tt := range tests {
		t.Run(tt.cond, func(t *testing.T) {
			t.Parallel()
			_, err := w.EdgeFires(workflow.Edge{From: "a", To: "b", Condition: tt.cond}, env)
			require.EqualError(t, err, tt.want)
			var ce *workflow.ConditionError
			require.ErrorAs(t, err, &ce)
			require.Equal(t, tt.cond, ce.Expression)
		})
	}
}

func TestConditionalEdgesOfParsedWorkflow(t *testing.T) {
	t.Parallel()

	w := mustParse(t, conditionWorkflow)
	env := testEnv(t)

	n, _ := w.Node("check")
	cond, err := n.Condition()
	require.NoError(t, err)
	result, err := w.Eval(cond.Expression, env)
	require.NoError(t, err)
	require.Equal(t, "good", result)

	env.Steps["check"] = map[string]any{"result": result}
	var fired []string
	for _, e := range w.Outgoing("check") {
		ok, err := w.EdgeFires(e, env)
		require.NoError(t, err)
		if ok {
			fired = append(fired, e.To)
		}
	}
	require.Equal(t, []string{"good"}, fired)
}

func TestEval(t *testing.T) {
	t.Parallel()

	w := mustParse(t, conditionWorkflow)
	env := testEnv(t)
	tests := []struct {
		expr string
		want any
	}{
		{"input.n + 1", 4},
		{"steps.draft.output.score * 100", 91.0},
		{"input.user.name", "Ada"},
		{"input.tags", []any{"a", "b"}},
		{`{"n": input.n, "ok": steps.raw.output.ok}`, map[string]any{"n": 3, "ok": true}},
		{"input.nothing", nil},
		{"steps.fetch.output.items[0].url", "https://a.test/1"},
		{"input.big", 12345678901234567890.0},
		{"keys(steps.draft.output)", []any{"score", "text", "usage"}},
	}
	for _, tt := range tests {
		t.Run(tt.expr, func(t *testing.T) {
			t.Parallel()
			got, err := w.Eval(tt.expr, env)
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}

	_, err := w.Eval("date('2024-01-01')", env)
	require.EqualError(t, err, "unknown name date at column 1 (date is not available: a condition must give the same result when a run is replayed)")
	var ee *workflow.ExprError
	require.ErrorAs(t, err, &ee)
	require.Equal(t, 1, ee.Column)

	_, err = w.Eval("steps.review.output.ok", env)
	require.ErrorAs(t, err, &ee)
}

func TestConditionsAreDeterministic(t *testing.T) {
	t.Parallel()

	w := mustParse(t, conditionWorkflow)
	wide := map[string]any{}
	for i := range 64 {
		wide[fmt.Sprintf("k%02d", i)] = i
	}
	env := workflow.Env{Input: wide}
	first, err := w.Eval("[keys(input), values(input), toPairs(input)]", env)
	require.NoError(t, err)
	for range 50 {
		got, err := w.Eval("[keys(input), values(input), toPairs(input)]", env)
		require.NoError(t, err)
		require.Equal(t, first, got)
	}
}

func TestConditionsConcurrent(t *testing.T) {
	t.Parallel()

	w := mustParse(t, conditionWorkflow)
	env := testEnv(t)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				// New expressions are compiled and cached while others run.
				if _, err := w.Eval(fmt.Sprintf("input.n + %d", (g*50+i)%17), env); err != nil {
					errs <- err
					return
				}
				ok, err := w.EdgeFires(workflow.Edge{From: "check", To: "good", Condition: "steps.draft.output.score > 0.5"}, env)
				if err != nil || !ok {
					errs <- errors.Join(err, errors.New("edge did not fire"))
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

func TestConditionsWithoutParse(t *testing.T) {
	t.Parallel()

	// A Workflow literal (not from Parse) still evaluates, uncached.
	w := &workflow.Workflow{}
	ok, err := w.EdgeFires(workflow.Edge{From: "a", To: "b", Condition: "input.x == 1"}, workflow.Env{Input: map[string]any{"x": 1}})
	require.NoError(t, err)
	require.True(t, ok)
}
