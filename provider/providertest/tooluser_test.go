package providertest_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/provider/providertest"
)

// TestToolUser: offered tools, the fake calls each once with arguments
// that fit its schema (required properties, enums, nested objects), in
// both wire formats; given their results it answers with them; with no
// tools it echoes.
func TestToolUser(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.srv.SetResponder(providertest.ToolUser)
	const schema = `{"type":"object","properties":{"text":{"type":"string"},"n":{"type":"integer"},
		"mode":{"type":"string","enum":["fast","slow"]},"opt":{"type":"boolean"},
		"inner":{"type":"object","properties":{"tags":{"type":"array","items":{"type":"string"}}},"required":["tags"]}},
		"required":["text","n","mode","inner"]}`

	// OpenAI: two tools, one turn calling both.
	a := b.post(ctx, chatPath, "", `{"model":"m","messages":[{"role":"user","content":"what is PAL?"}],
		"tools":[{"type":"function","function":{"name":"lookup","parameters":`+schema+`}},
		         {"type":"function","function":{"name":"echo","parameters":{"type":"object","properties":{"text":{"type":"string"}}}}}]}`)
	require.NoError(t, a.err)
	msg := a.body["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)
	calls := msg["tool_calls"].([]any)
	require.Len(t, calls, 2)
	fn := calls[0].(map[string]any)["function"].(map[string]any)
	require.Equal(t, "lookup", fn["name"])
	require.JSONEq(t, `{"text":"what is PAL?","n":1,"mode":"fast","inner":{"tags":["what is PAL?"]}}`, fn["arguments"].(string))
	require.JSONEq(t, `{"text":"what is PAL?"}`, calls[1].(map[string]any)["function"].(map[string]any)["arguments"].(string),
		"no required list: every property")

	// The results come back: the final answer quotes them, no more calls.
	a = b.post(ctx, chatPath, "", `{"model":"m","messages":[{"role":"user","content":"what is PAL?"},
		{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"echo","arguments":"{}"}}]},
		{"role":"tool","tool_call_id":"c1","content":"{\"text\":\"durable\"}"}],
		"tools":[{"type":"function","function":{"name":"echo","parameters":{"type":"object"}}}]}`)
	require.NoError(t, a.err)
	msg = a.body["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)
	require.Nil(t, msg["tool_calls"])
	require.Equal(t, `echo: what is PAL? (echo returned {"text":"durable"})`, msg["content"])

	// Anthropic: input_schema.
	a = b.post(ctx, messagesPath, "", `{"model":"m","max_tokens":50,"messages":[{"role":"user","content":"hi"}],
		"tools":[{"name":"echo","input_schema":{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}}]}`)
	require.NoError(t, a.err)
	block := a.body["content"].([]any)[0].(map[string]any)
	require.Equal(t, "tool_use", block["type"])
	require.Equal(t, map[string]any{"text": "hi"}, block["input"])

	// No tools: the default answer.
	a = b.post(ctx, chatPath, "", `{"model":"m","messages":[{"role":"user","content":"plain"}]}`)
	require.Equal(t, "echo: plain", a.body["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)["content"])

	// A hostile schema: deep nesting stops at the bound, a huge one is
	// read once; neither hangs nor fails.
	deep := strings.Repeat(`{"type":"object","properties":{"a":`, 50) + `{"type":"string"}` + strings.Repeat(`},"required":["a"]}`, 50)
	a = b.post(ctx, chatPath, "", `{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"deep","parameters":`+deep+`}}]}`)
	require.NoError(t, a.err)
	args := a.body["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)["tool_calls"].([]any)[0].(map[string]any)["function"].(map[string]any)["arguments"].(string)
	var v any
	require.NoError(t, json.Unmarshal([]byte(args), &v))
	require.Less(t, strings.Count(args, `"a"`), 6, "nesting bounded: %s", args)
}
