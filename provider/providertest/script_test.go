package providertest_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/provider"
	"github.com/palrun/pal/provider/providertest"
)

// fakeHeaders are the headers of a request carrying a fake block for step.
func fakeHeaders(block, step string) http.Header {
	h := http.Header{}
	h.Set(provider.FakeHeader, block)
	if step != "" {
		h.Set(provider.FakeStepHeader, step)
	}
	return h
}

const script = `{"turns":[{"toolCalls":[{"name":"echo","arguments":{"text":"2+2"}}]},{"text":"It is 4 — sure."},{"json":{"answer":4}}]}`

// TestScriptedTurns: turn i answers the request whose conversation holds
// i assistant messages, in both wire formats; past the script's end the
// responder answers; a request without the block is not scripted.
func TestScriptedTurns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.srv.SetResponder(providertest.ToolUser)
	h := fakeHeaders(script, "run1/ask")
	tools := `"tools":[{"type":"function","function":{"name":"echo","parameters":{"type":"object","properties":{"text":{"type":"string"}}}}},
		{"type":"function","function":{"name":"other","parameters":{"type":"object"}}}]`

	// Turn 0: the scripted call (not ToolUser's two).
	a := b.postWith(ctx, chatPath, h, `{"model":"m","messages":[{"role":"user","content":"add"}],`+tools+`}`)
	require.NoError(t, a.err)
	require.Equal(t, http.StatusOK, a.status)
	calls := a.body["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)["tool_calls"].([]any)
	require.Len(t, calls, 1)
	fn := calls[0].(map[string]any)["function"].(map[string]any)
	require.Equal(t, "echo", fn["name"])
	require.JSONEq(t, `{"text":"2+2"}`, fn["arguments"].(string))

	// Turn 1: the text, after one assistant message.
	one := `{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"echo","arguments":"{}"}}]},
		{"role":"tool","tool_call_id":"c1","content":"2+2"}`
	a = b.postWith(ctx, chatPath, h, `{"model":"m","messages":[{"role":"user","content":"add"},`+one+`],`+tools+`}`)
	require.NoError(t, a.err)
	msg := a.body["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)
	require.Equal(t, "It is 4 — sure.", msg["content"], "non-ASCII text travels in the header")
	require.Nil(t, msg["tool_calls"])

	// Turn 2: json, as compact text (Anthropic's wire format).
	a = b.postWith(ctx, messagesPath, h, `{"model":"m","max_tokens":50,"messages":[{"role":"user","content":"add"},
		{"role":"assistant","content":"a"},{"role":"user","content":"b"},{"role":"assistant","content":"c"},{"role":"user","content":"d"}]}`)
	require.NoError(t, a.err)
	block := a.body["content"].([]any)[0].(map[string]any)
	require.Equal(t, `{"answer":4}`, block["text"])

	// Past the end: the responder (ToolUser, every tool called: its answer).
	three := strings.Repeat(`{"role":"assistant","content":"x"},{"role":"user","content":"y"},`, 3)
	a = b.postWith(ctx, chatPath, h, `{"model":"m","messages":[{"role":"user","content":"add"},`+three+`{"role":"user","content":"last"}]}`)
	require.NoError(t, a.err)
	require.Equal(t, "echo: last", a.body["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)["content"])

	// No block: ToolUser calls both tools.
	a = b.post(ctx, chatPath, "", `{"model":"m","messages":[{"role":"user","content":"add"}],`+tools+`}`)
	require.NoError(t, a.err)
	require.Len(t, a.body["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)["tool_calls"].([]any), 2)

	// X-Pal-Fake-Turn names the turn, whatever assistant messages the
	// conversation holds (an ai-step's few-shot prompt, a thread).
	h1 := h.Clone()
	h1.Set(provider.FakeTurnHeader, "1")
	a = b.postWith(ctx, chatPath, h1, `{"model":"m","messages":[{"role":"user","content":"add"}]}`)
	require.NoError(t, a.err)
	require.Equal(t, "It is 4 — sure.", a.body["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)["content"])

	calls2 := b.srv.Calls()
	require.Len(t, calls2, 6)
	require.NotNil(t, calls2[0].Fake)
	require.Len(t, calls2[0].Fake.Turns, 3)
	require.Nil(t, calls2[4].Fake)
	require.NotNil(t, calls2[5].Fake)
}

// TestScriptedFailure: the first fail.times requests of a step fail with
// the status, whatever their idempotency keys; another step counts its
// own; Reset forgets the counts.
func TestScriptedFailure(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	block := `{"turns":[{"text":"ok"}],"fail":{"status":429,"times":2}}`
	send := func(step, key string) answer {
		h := fakeHeaders(block, step)
		h.Set("Idempotency-Key", key)
		return b.postWith(ctx, chatPath, h, chatBody)
	}
	a := send("run1/ask", "k1")
	require.Equal(t, http.StatusTooManyRequests, a.status)
	require.Contains(t, a.body["error"].(map[string]any)["message"], "fake block")
	require.Equal(t, http.StatusTooManyRequests, send("run1/ask", "k2").status, "a new key is the same step")
	require.Equal(t, http.StatusTooManyRequests, send("run2/ask", "k3").status, "another run's step counts its own")
	a = send("run1/ask", "k2")
	require.Equal(t, http.StatusOK, a.status)
	require.Equal(t, "ok", a.body["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)["content"])
	require.Equal(t, http.StatusOK, send("run1/ask", "k4").status)

	// Without a step header the key is the step.
	h := fakeHeaders(`{"fail":{"status":503,"times":1}}`, "")
	h.Set("Idempotency-Key", "solo")
	require.Equal(t, http.StatusServiceUnavailable, b.postWith(ctx, messagesPath, h, messagesBody).status)
	require.Equal(t, http.StatusOK, b.postWith(ctx, messagesPath, h, messagesBody).status)

	b.srv.Reset()
	require.Equal(t, http.StatusTooManyRequests, send("run1/ask", "k5").status, "Reset forgets the counts")
}

// TestBadFakeBlock: a block that is not one, or too big, is a 400 naming
// the header; it is recorded like any request.
func TestBadFakeBlock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	for name, block := range map[string]string{
		"not JSON":  `{"turns":`,
		"not turns": `{"turns":{"text":"x"}}`,
		"too big":   `{"turns":[{"text":"` + strings.Repeat("x", 9000) + `"}]}`,
		"too many":  `{"turns":[` + strings.Repeat(`{"text":"x"},`, 40) + `{"text":"x"}]}`,
	} {
		a := b.postWith(ctx, chatPath, fakeHeaders(block, "r/s"), chatBody)
		require.Equal(t, http.StatusBadRequest, a.status, name)
		require.Contains(t, a.body["error"].(map[string]any)["message"], provider.FakeHeader, name)
	}
	for _, turn := range []string{"-1", "x", "1001"} {
		h := fakeHeaders(script, "r/s")
		h.Set(provider.FakeTurnHeader, turn)
		a := b.postWith(ctx, chatPath, h, chatBody)
		require.Equal(t, http.StatusBadRequest, a.status, turn)
		require.Contains(t, a.body["error"].(map[string]any)["message"], provider.FakeTurnHeader+`: "`+turn, turn)
	}
	require.Len(t, b.srv.Calls(), 7)
}
