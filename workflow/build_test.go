package workflow_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/workflow"
)

// TestBuild: a workflow built in code is the document a hand would write,
// held to the same checks.
func TestBuild(t *testing.T) {
	t.Parallel()
	n, err := workflow.NewNode("ask", workflow.AIStepData{Provider: "openai", Model: workflow.ModelOf("gpt-4o"), Prompt: "hi {{input.name}}", MaxTokens: 5})
	require.NoError(t, err)
	require.Equal(t, workflow.TypeAIStep, n.Type)
	wf, err := workflow.Build("one", []workflow.Node{workflow.TriggerNode("start"), n}, []workflow.Edge{{From: "start", To: "ask"}})
	require.NoError(t, err)
	require.JSONEq(t, `{"name":"one","nodes":[{"id":"start","type":"trigger"},
		{"id":"ask","type":"ai-step","data":{"provider":"openai","model":"gpt-4o","prompt":"hi {{input.name}}","maxTokens":5}}],
		"edges":[{"from":"start","to":"ask"}]}`, string(wf.Raw()))
	again, err := workflow.Parse(wf.Raw())
	require.NoError(t, err)
	require.Equal(t, wf.Hash(), again.Hash())

	// Checked as Parse checks: an edge to no node, a template that does
	// not parse.
	_, err = workflow.Build("one", []workflow.Node{workflow.TriggerNode("start"), n}, []workflow.Edge{{From: "start", To: "nowhere"}})
	var ve *workflow.ValidationError
	require.ErrorAs(t, err, &ve)
	bad, err := workflow.NewNode("ask", workflow.AIStepData{Provider: "openai", Model: workflow.ModelOf("gpt-4o"), Prompt: "hi {{input."})
	require.NoError(t, err)
	_, err = workflow.Build("one", []workflow.Node{workflow.TriggerNode("start"), bad}, []workflow.Edge{{From: "start", To: "ask"}})
	require.ErrorAs(t, err, &ve)

	_, err = workflow.NewNode("use", workflow.AgentData{Provider: "openai", Model: workflow.ModelOf("gpt-4o"), Prompt: "x",
		Tools: []workflow.AgentTool{{Name: "t", Parameters: json.RawMessage(`{not json`)}}})
	require.ErrorContains(t, err, `node "use"`)
}

// TestModels: every model a run can call, nested workflows and judges
// included.
func TestModels(t *testing.T) {
	t.Parallel()
	wf, err := workflow.Parse([]byte(`{"name":"m","nodes":[{"id":"start","type":"trigger"},
		{"id":"a","type":"ai-step","data":{"provider":"openai","model":"GPT-4o","prompt":"x",
		  "confidence":{"min":0.5,"source":"judge","judge":{"provider":"anthropic","model":"claude-haiku-4-5","prompt":"rate"}}}},
		{"id":"each","type":"loop","data":{"over":"{{input.items}}","body":{"name":"b","nodes":[{"id":"start","type":"trigger"},
		  {"id":"ask","type":"agent","data":{"provider":"openai","model":"gpt-4.1","prompt":"y"}}],"edges":[{"from":"start","to":"ask"}]}}},
		{"id":"sub","type":"subagent","data":{"workflow":{"name":"c","nodes":[{"id":"start","type":"trigger"},
		  {"id":"z","type":"ai-step","data":{"provider":"openai","model":"gpt-4o","prompt":"z"}}],"edges":[{"from":"start","to":"z"}]}}},
		{"id":"t","type":"tool","data":{"tool":"echo"}}],
		"edges":[{"from":"start","to":"a"},{"from":"a","to":"each"},{"from":"each","to":"sub"},{"from":"sub","to":"t"}]}`))
	require.NoError(t, err)
	require.Equal(t, []string{"claude-haiku-4-5", "gpt-4.1", "gpt-4o"}, wf.Models())
}
