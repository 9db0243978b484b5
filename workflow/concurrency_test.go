package workflow_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/workflow"
)

// concurrencyWorkflow is a workflow whose policy, loop, agent and node
// settings are the JSON fragments given ("" leaves one out).
func concurrencyWorkflow(policy, loop, agent, onFailure string) string {
	if policy != "" {
		policy = `,"policy":{"concurrency":` + policy + `}`
	}
	if loop != "" {
		loop = `,"concurrency":` + loop
	}
	if agent != "" {
		agent = `,"parallelToolCalls":` + agent
	}
	if onFailure != "" {
		onFailure = `,"onFailure":` + onFailure
	}
	return `{"name":"x","nodes":[{"id":"start","type":"trigger"},
		{"id":"each","type":"loop","data":{"over":"{{input.xs}}"` + loop + `,"body":{"name":"b","nodes":[{"id":"start","type":"trigger"},
			{"id":"t","type":"tool","data":{"tool":"echo"}}],"edges":[{"from":"start","to":"t"}]}}},
		{"id":"ask","type":"agent"` + onFailure + `,"data":{"provider":"openai","model":"m","prompt":"p"` + agent + `}}],
		"edges":[{"from":"start","to":"each"},{"from":"start","to":"ask"}]` + policy + `}`
}

func TestConcurrencySettingsDefaults(t *testing.T) {
	t.Parallel()
	w := mustParse(t, concurrencyWorkflow("", "", "", ""))
	require.Equal(t, workflow.DefaultConcurrency, w.Concurrency())
	n, _ := w.Node("each")
	d, err := n.Loop()
	require.NoError(t, err)
	require.Equal(t, 1, d.Parallel())
	a, _ := w.Node("ask")
	ad, err := a.Agent()
	require.NoError(t, err)
	require.True(t, ad.ParallelCalls())
	require.False(t, a.Continues())

	w = mustParse(t, concurrencyWorkflow("1000", "1000", "false", `"continue"`))
	require.Equal(t, 1000, w.Concurrency())
	n, _ = w.Node("each")
	d, err = n.Loop()
	require.NoError(t, err)
	require.Equal(t, 1000, d.Parallel())
	a, _ = w.Node("ask")
	ad, err = a.Agent()
	require.NoError(t, err)
	require.False(t, ad.ParallelCalls())
	require.True(t, a.Continues())

	w = mustParse(t, concurrencyWorkflow("1", "1", "true", `"fail"`))
	require.Equal(t, 1, w.Concurrency())
	a, _ = w.Node("ask")
	require.False(t, a.Continues())
}

// TestConcurrencySettingsRefuseHostileValues: each setting is bounded by
// the schema, and a value out of its bounds or of another type is refused
// with its field named, before anything runs.
func TestConcurrencySettingsRefuseHostileValues(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, wf, want string
	}{
		{"policy zero", concurrencyWorkflow("0", "", "", ""), `policy.concurrency: must be at least 1 (got 0)`},
		{"policy negative", concurrencyWorkflow("-8", "", "", ""), `policy.concurrency: must be at least 1 (got -8)`},
		{"policy over", concurrencyWorkflow("1001", "", "", ""), `policy.concurrency: must be at most 1000 (got 1001)`},
		{"policy huge", concurrencyWorkflow("1e300", "", "", ""), `policy.concurrency`},
		{"policy past int64", concurrencyWorkflow("92233720368547758070", "", "", ""), `policy.concurrency`},
		{"policy fraction", concurrencyWorkflow("2.5", "", "", ""), `policy.concurrency`},
		{"policy string", concurrencyWorkflow(`"8"`, "", "", ""), `policy.concurrency`},
		{"policy null", concurrencyWorkflow(`null`, "", "", ""), `policy.concurrency`},
		{"loop zero", concurrencyWorkflow("", "0", "", ""), `node "each": data.concurrency: must be at least 1 (got 0)`},
		{"loop over", concurrencyWorkflow("", "100000", "", ""), `node "each": data.concurrency: must be at most 1000 (got 100000)`},
		{"loop fraction", concurrencyWorkflow("", "1.5", "", ""), `node "each": data.concurrency`},
		{"loop array", concurrencyWorkflow("", "[4]", "", ""), `node "each": data.concurrency`},
		{"agent string", concurrencyWorkflow("", "", `"yes"`, ""), `node "ask": data.parallelToolCalls`},
		{"agent number", concurrencyWorkflow("", "", `1`, ""), `node "ask": data.parallelToolCalls`},
		{"onFailure unknown", concurrencyWorkflow("", "", "", `"ignore"`), `node "ask": onFailure`},
		{"onFailure case", concurrencyWorkflow("", "", "", `"Continue"`), `node "ask": onFailure`},
		{"onFailure bool", concurrencyWorkflow("", "", "", `true`), `node "ask": onFailure`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := workflow.Parse([]byte(tc.wf))
			require.ErrorIs(t, err, workflow.ErrInvalid)
			require.Contains(t, err.Error(), tc.want)
		})
	}
}

// TestLoopUntilRunsInOrder: until decides after each iteration in order,
// so a loop with until may not run iterations at once.
func TestLoopUntilRunsInOrder(t *testing.T) {
	t.Parallel()
	wf := `{"name":"x","nodes":[{"id":"start","type":"trigger"},
		{"id":"each","type":"loop","data":{"until":"steps.t.output.done","concurrency":4,"body":{"name":"b","nodes":[{"id":"start","type":"trigger"},
			{"id":"t","type":"tool","data":{"tool":"echo"}}],"edges":[{"from":"start","to":"t"}]}}}],
		"edges":[{"from":"start","to":"each"}]}`
	_, err := workflow.Parse([]byte(wf))
	require.ErrorIs(t, err, workflow.ErrInvalid)
	require.Contains(t, err.Error(), `node "each": data.concurrency: until stops the loop`)
}

// TestConditionsReadStepStatus: a condition reads steps.<id>.status
// ("completed", or "failed" for a step whose node continues) and
// steps.<id>.error; other members than output, status and error are
// refused at parse.
func TestConditionsReadStepStatus(t *testing.T) {
	t.Parallel()
	w := mustParse(t, `{"name":"x","nodes":[{"id":"start","type":"trigger"},
		{"id":"a","type":"tool","onFailure":"continue","data":{"tool":"echo"}},
		{"id":"b","type":"tool","data":{"tool":"echo"}}],
		"edges":[{"from":"start","to":"a"},{"from":"a","to":"b","condition":"steps.a.status == \"failed\""}]}`)
	e := w.Outgoing("a")[0]
	fires, err := w.EdgeFires(e, workflow.Env{Failed: map[string]string{"a": "boom"}})
	require.NoError(t, err)
	require.True(t, fires)
	fires, err = w.EdgeFires(e, workflow.Env{Steps: map[string]any{"a": map[string]any{"x": 1}}})
	require.NoError(t, err)
	require.False(t, fires)
	v, err := w.Eval(`steps.a.error + "/" + steps.a.status`, workflow.Env{Failed: map[string]string{"a": "boom"}})
	require.NoError(t, err)
	require.Equal(t, "boom/failed", v)
	v, err = w.Eval(`steps.a.status`, workflow.Env{Steps: map[string]any{"a": nil}})
	require.NoError(t, err)
	require.Equal(t, "completed", v)

	_, err = workflow.Parse([]byte(`{"name":"x","nodes":[{"id":"start","type":"trigger"},
		{"id":"a","type":"tool","data":{"tool":"echo"}},{"id":"b","type":"tool","data":{"tool":"echo"}}],
		"edges":[{"from":"start","to":"a"},{"from":"a","to":"b","condition":"steps.a.state == \"failed\""}]}`))
	require.ErrorIs(t, err, workflow.ErrInvalid)
	require.Contains(t, err.Error(), `steps.a has no field "state"`)
}
