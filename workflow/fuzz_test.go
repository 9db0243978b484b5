package workflow_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/workflow"
)

func addTestdataSeeds(f *testing.F) {
	f.Helper()
	files, err := filepath.Glob("testdata/*/*.json")
	require.NoError(f, err)
	for _, file := range files {
		raw, err := os.ReadFile(file)
		require.NoError(f, err)
		f.Add(raw)
	}
	f.Add([]byte(diamond))
	f.Add([]byte(conditionWorkflow))
	f.Add([]byte(`{"name":"x","nodes":[{"id":"s","type":"trigger"}],"edges":[{"from":"s","to":"s"}]}`))
	f.Add([]byte(`{"name":"x","nodes":[{"id":"s","type":"trigger"},{"id":"a","type":"tool","data":{"tool":"t","input":"{{steps.a.output}}"}}],"edges":[{"from":"s","to":"a"}]}`))
	f.Add([]byte(`[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]`))
	f.Add([]byte(`{"name":"\u00e9\ud800","nodes":null}`))
}

// FuzzParse checks that Parse never panics, that every refusal is a
// *ValidationError, and that what it accepts is consistent.
func FuzzParse(f *testing.F) {
	addTestdataSeeds(f)
	f.Fuzz(func(t *testing.T, raw []byte) {
		w, err := workflow.Parse(raw)
		if err != nil {
			require.Nil(t, w)
			var ve *workflow.ValidationError
			require.True(t, errors.As(err, &ve), "unexpected error type %T: %v", err, err)
			require.NotEmpty(t, ve.Problems)
			require.True(t, strings.HasPrefix(err.Error(), "workflow"))
			return
		}

		require.True(t, json.Valid(w.Raw()))
		require.Len(t, w.Hash(), 64)

		// Order is a topological permutation of the nodes.
		order := w.Order()
		require.Len(t, order, len(w.Nodes))
		pos := map[string]int{}
		for i, id := range order {
			_, ok := w.Node(id)
			require.True(t, ok)
			pos[id] = i
		}
		require.Len(t, pos, len(w.Nodes))
		for _, e := range w.Edges {
			require.Less(t, pos[e.From], pos[e.To], "edge %s→%s", e.From, e.To)
		}
		require.Equal(t, order[0], w.Trigger().ID)

		// Typed data decodes for every node.
		for i := range w.Nodes {
			n := &w.Nodes[i]
			var err error
			switch n.Type {
			case workflow.TypeAIStep:
				_, err = n.AIStep()
			case workflow.TypeTool:
				_, err = n.Tool()
			case workflow.TypeConnector:
				_, err = n.Connector()
			case workflow.TypeCondition:
				_, err = n.Condition()
			}
			require.NoError(t, err)
			_ = n.Retry()
		}

		// Parsing the compact form gives the same workflow.
		w2, err := workflow.Parse(w.Raw())
		require.NoError(t, err)
		require.Equal(t, w.Hash(), w2.Hash())
		require.Equal(t, order, w2.Order())
	})
}

// FuzzRenderString checks that rendering never panics and is deterministic.
func FuzzRenderString(f *testing.F) {
	for _, s := range []string{
		"", "plain", "{{input.text}}", "a {{ steps.draft.output.usage.tokens }} b", `\{{x}}`,
		"{{input.tags[1]}}{{input.tags[9]}}", "{{", "}}{{}}", "{{input.a[", "{{steps.x.output[0][1].y}}",
	} {
		f.Add(s)
	}
	f.Add("{{input.text}}" + strings.Repeat("x", workflow.MaxTemplateBytes))
	env := testEnv(f)
	f.Fuzz(func(t *testing.T, s string) {
		a, errA := workflow.RenderString(s, env)
		b, errB := workflow.RenderString(s, env)
		require.Equal(t, a, b)
		require.Equal(t, errA, errB)
		if !strings.Contains(s, "{{") {
			require.NoError(t, errA)
			require.Equal(t, s, a)
		}
	})
}

// fuzzEnv is what FuzzExpression evaluates over: strings and arrays big
// enough for a loop over them to cost something.
func fuzzEnv() workflow.Env {
	items := make([]any, 1000)
	for i := range items {
		items[i] = i
	}
	return workflow.Env{
		Input: map[string]any{"s": strings.Repeat("a", 10_000), "n": 999_999, "one": "a", "items": items,
			"user": map[string]any{"name": "Ada"}},
		Steps: map[string]any{"a": map[string]any{"ok": true, "score": 0.5}},
	}
}

// FuzzExpression compiles and evaluates expressions, as a condition node
// and as an edge condition: whatever the expression, Parse refuses it with
// a *ValidationError or the evaluation ends within its bounds, without a
// panic, with an *ExprError or a *ConditionError.
func FuzzExpression(f *testing.F) {
	for _, s := range []string{
		"true", "input.n > 3", `steps.a.output.ok && input.user.name == "Ada"`, `len(input.items) > 10`,
		`any(input.items, # > 500)`, `input.s matches "^a+$"`, `repeat("ab", 3) == "ababab"`,
		`reduce(1..10, #acc + #, 0) == 55`, `toJSON(keys(input.user))`, `(((((true)))))`,
	} {
		f.Add(s)
	}
	env := fuzzEnv()
	base := mustParse(f, `{"name":"fuzz","nodes":[{"id":"start","type":"trigger"},{"id":"a","type":"tool","data":{"tool":"t"}}],"edges":[{"from":"start","to":"a"}]}`)
	f.Fuzz(func(t *testing.T, expr string) {
		start := time.Now()
		_, err := base.Eval(expr, env)
		if err != nil {
			var ee *workflow.ExprError
			require.True(t, errors.As(err, &ee), "unexpected error type %T: %v", err, err)
		}
		w, err := workflow.Parse(edgeWorkflow(t, expr))
		if err != nil {
			var ve *workflow.ValidationError
			require.True(t, errors.As(err, &ve), "unexpected error type %T: %v", err, err)
		} else {
			_, err := w.EdgeFires(w.Edges[0], env)
			if err != nil {
				var ce *workflow.ConditionError
				require.True(t, errors.As(err, &ce), "unexpected error type %T: %v", err, err)
			}
		}
		// Two evaluations, each stopped at EvalTimeout: not a speed check,
		// a bound that only an evaluation that is never stopped passes,
		// far above what a loaded machine adds.
		require.Less(t, time.Since(start), 2*workflow.EvalTimeout+30*time.Second)
	})
}
