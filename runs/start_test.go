package runs_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/runs"
	"github.com/palrun/pal/workflow"
)

// A start with an idempotency key that finds its run id taken is the same
// start only if the run's run_created carries that key; a run made with
// no key, or another key, refuses it (ErrRunExists, conflict).
func TestStartWithKeyIsADuplicateOnlyOfTheSameKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	wf := json.RawMessage(echoChain(1))
	start := func(runID, key string) (runs.StartResult, error) {
		return b.Runs.Start(ctx, runs.StartCommand{Rights: runs.AllRights, Workflow: wf, RunID: runID, IdempotencyKey: key})
	}

	res, err := start("run_same", "")
	require.NoError(t, err)
	require.True(t, res.Created)
	_, err = start("run_same", "other")
	require.ErrorIs(t, err, runs.ErrRunExists, "a run made with no key is not this start")
	code, _, _ := runs.Classify(err)
	require.Equal(t, runs.CodeConflict, code)

	res, err = start("run_keyed", "k1")
	require.NoError(t, err)
	require.True(t, res.Created)
	res, err = start("run_keyed", "k1")
	require.NoError(t, err, "the same start again")
	require.Equal(t, runs.StartResult{RunID: "run_keyed", Created: false}, res)
	_, err = start("run_keyed", "k2")
	require.ErrorIs(t, err, runs.ErrRunExists, "a run made with another key is not this start")

	// A run that took a key's derived run id without the key is not the
	// key's start either.
	_, err = start(runs.RunIDForKey("k3"), "")
	require.NoError(t, err)
	_, err = start("", "k3")
	require.ErrorIs(t, err, runs.ErrRunExists)

	for _, id := range []string{"run_same", "run_keyed", runs.RunIDForKey("k3")} {
		require.Len(t, find(b.Events(t, id), event.RunCreated, ""), 1, id)
	}
}

// TestLLMWorkflow: a plain-LLM run's workflow is a trigger and one node,
// an ai-step or (with tools) an agent, in the bytes runs journaled before
// the workflow was built from typed nodes, so its hash is unchanged.
func TestLLMWorkflow(t *testing.T) {
	t.Parallel()
	wf, err := runs.LLMWorkflow(&runs.LLMSpec{Provider: "openai", Model: "gpt-4o", Prompt: "hi", MaxTokens: 9})
	require.NoError(t, err)
	require.Equal(t, `{"name":"llm","nodes":[{"id":"start","type":"trigger"},`+
		`{"id":"llm","type":"ai-step","data":{"provider":"openai","model":"gpt-4o","prompt":"hi","maxTokens":9}}],`+
		`"edges":[{"from":"start","to":"llm"}]}`, string(wf.Raw()))

	wf, err = runs.LLMWorkflow(&runs.LLMSpec{Provider: "openai", Model: "gpt-4o", Prompt: "hi",
		Tools: []workflow.AgentTool{{Name: "lookup"}}})
	require.NoError(t, err)
	require.Equal(t, `{"name":"agent","nodes":[{"id":"start","type":"trigger"},`+
		`{"id":"agent","type":"agent","data":{"provider":"openai","model":"gpt-4o","prompt":"hi","tools":[{"name":"lookup"}]}}],`+
		`"edges":[{"from":"start","to":"agent"}]}`, string(wf.Raw()))

	_, err = runs.LLMWorkflow(&runs.LLMSpec{Provider: "openai", Model: "gpt-4o", MaxTurns: 2,
		Messages: []workflow.Message{{Role: "user", Content: "hi"}}})
	var ie *runs.InputError
	require.ErrorAs(t, err, &ie)
	require.Equal(t, "llm.messages", ie.Field)
	_, err = runs.LLMWorkflow(&runs.LLMSpec{Provider: "openai", Model: "gpt-4o"})
	var ve *workflow.ValidationError
	require.ErrorAs(t, err, &ve, "an ai-step with neither prompt nor messages")
}
