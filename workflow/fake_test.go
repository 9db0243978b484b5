package workflow_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/workflow"
)

// agentWorkflow is a one-step workflow whose agent has data.
func agentWorkflow(data string) string {
	return `{"name":"x","nodes":[{"id":"start","type":"trigger"},{"id":"a","type":"agent","data":` + data + `}],
	  "edges":[{"from":"start","to":"a"}]}`
}

func TestFakeBlock(t *testing.T) {
	t.Parallel()
	w := mustParse(t, agentWorkflow(`{"provider":"openai","model":"m","prompt":"hi",
	  "tools":[{"name":"echo","parameters":{"type":"object"}}],
	  "fake":{"turns":[{"toolCalls":[{"name":"echo","arguments":{"text":"2+2"}}]},{"text":"It is 4."},{"json":{ "answer" : 4 }}],
	          "fail":{"status":429,"times":1}}}`))
	n, _ := w.Node("a")
	f := workflow.FakeOf(n)
	require.NotNil(t, f)
	require.Len(t, f.Turns, 3)
	require.Equal(t, "echo", f.Turns[0].ToolCalls[0].Name)
	require.Equal(t, "It is 4.", f.Turns[1].AnswerText())
	require.Equal(t, `{"answer":4}`, f.Turns[2].AnswerText(), "json is sent as its compact text")
	require.Equal(t, &workflow.FakeFail{Status: 429, Times: 1}, f.Fail)
	h, err := f.Header()
	require.NoError(t, err)
	require.NotContains(t, h, "\n")
	require.Contains(t, h, `"fail":{"status":429,"times":1}`)

	ai := mustParse(t, aiWorkflow(`{"provider":"openai","model":"m","prompt":"hi","fake":{"turns":[{"text":"scripted"}]}}`))
	n, _ = ai.Node("d")
	require.Equal(t, "scripted", workflow.FakeOf(n).Turns[0].Text)
	n, _ = ai.Node("start")
	require.Nil(t, workflow.FakeOf(n))

	// An agent with an MCP server may script its tools' calls by name.
	mustParse(t, agentWorkflow(`{"provider":"openai","model":"m","prompt":"hi","tools":[{"mcp":"files"}],
	  "fake":{"turns":[{"toolCalls":[{"name":"read_file"}]}]}}`))
}

func TestFakeBlockProblems(t *testing.T) {
	t.Parallel()
	turn := `{"text":"` + strings.Repeat("x", 8000) + `"}`
	big := `{"turns":[` + strings.Repeat(turn+",", 1) + turn + `]}`
	many := `{"turns":[` + strings.Repeat(`{"text":"x"},`, workflow.MaxFakeTurns) + `{"text":"x"}]}`
	for name, tt := range map[string]struct{ doc, want string }{
		"not an object":      {agentWorkflow(`{"provider":"openai","model":"m","prompt":"hi","fake":[1]}`), "data.fake"},
		"unknown field":      {agentWorkflow(`{"provider":"openai","model":"m","prompt":"hi","fake":{"turn":[]}}`), "data.fake"},
		"too many turns":     {agentWorkflow(`{"provider":"openai","model":"m","prompt":"hi","fake":` + many + `}`), "data.fake.turns: must have at most 32 items"},
		"too big":            {agentWorkflow(`{"provider":"openai","model":"m","prompt":"hi","fake":` + big + `}`), "data.fake: 16"},
		"empty turn":         {agentWorkflow(`{"provider":"openai","model":"m","prompt":"hi","fake":{"turns":[{}]}}`), "data.fake.turns[0]: give toolCalls, text or json"},
		"text and json":      {agentWorkflow(`{"provider":"openai","model":"m","prompt":"hi","fake":{"turns":[{"text":"a","json":1}]}}`), "data.fake.turns[0]: give text or json, not both"},
		"unknown tool":       {agentWorkflow(`{"provider":"openai","model":"m","prompt":"hi","tools":[{"name":"echo"}],"fake":{"turns":[{"toolCalls":[{"name":"ecko"}]}]}}`), `data.fake.turns[0].toolCalls[0].name: "ecko" is not one of the agent's tools (did you mean "echo"?)`},
		"arguments not obj":  {agentWorkflow(`{"provider":"openai","model":"m","prompt":"hi","tools":[{"name":"echo"}],"fake":{"turns":[{"toolCalls":[{"name":"echo","arguments":"x"}]}]}}`), "data.fake.turns[0].toolCalls[0].arguments: must be an object"},
		"ai-step tool call":  {aiWorkflow(`{"provider":"openai","model":"m","prompt":"hi","fake":{"turns":[{"toolCalls":[{"name":"echo"}]}]}}`), "data.fake.turns[0].toolCalls[0]: an ai-step offers no tools"},
		"status too low":     {aiWorkflow(`{"provider":"openai","model":"m","prompt":"hi","fake":{"fail":{"status":200,"times":1}}}`), "data.fake.fail.status: must be at least 400"},
		"status too high":    {aiWorkflow(`{"provider":"openai","model":"m","prompt":"hi","fake":{"fail":{"status":600,"times":1}}}`), "data.fake.fail.status: must be at most 599"},
		"times too many":     {aiWorkflow(`{"provider":"openai","model":"m","prompt":"hi","fake":{"fail":{"status":500,"times":11}}}`), "data.fake.fail.times: must be at most 10"},
		"fail without times": {aiWorkflow(`{"provider":"openai","model":"m","prompt":"hi","fake":{"fail":{"status":500}}}`), "data.fake.fail.times: missing required field"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := workflow.Parse([]byte(tt.doc))
			require.ErrorIs(t, err, workflow.ErrInvalid)
			require.Contains(t, err.Error(), tt.want)
		})
	}
}
