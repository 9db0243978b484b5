package anthropic_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/palrun/pal/provider"
	"github.com/palrun/pal/provider/anthropic"
	"github.com/palrun/pal/provider/providertest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// The behaviour both adapters share is tested by TestAdapters in package
// provider; these tests cover what is particular to the Messages wire
// format.

func TestRequestBody(t *testing.T) {
	srv := providertest.NewServer(t)
	p := anthropic.New(anthropic.Config{APIKey: "sk-test", BaseURL: srv.AnthropicBaseURL()})
	temp := 0.25
	_, err := p.Complete(context.Background(), provider.Request{
		Model:          "claude-haiku-4-5",
		System:         "be brief",
		Temperature:    &temp, // refused by API version 2026-10-21: not sent
		IdempotencyKey: "k",
		Tools: []provider.Tool{
			{Name: "lookup", Description: "Look up", Parameters: json.RawMessage(
				`{"type":"object","properties":{"q":{"type":"string"}},"required":["q"],"additionalProperties":false}`)},
			{Name: "now"},
		},
		Messages: []provider.Message{
			{Role: provider.RoleSystem, Content: "no jokes"},
			{Role: provider.RoleUser, Content: "hi"},
			{Role: provider.RoleAssistant, Content: "let me look", ToolCalls: []provider.ToolCall{
				{ID: "c1", Name: "lookup", Arguments: json.RawMessage(`{"q":"x"}`)},
				{ID: "c2", Name: "now"},
			}},
			{Role: provider.RoleTool, ToolCallID: "c1", Content: "found"},
			{Role: provider.RoleTool, ToolCallID: "c2", Content: "noon"},
			{Role: provider.RoleUser, Content: "and?"},
		},
	}, nil)
	require.NoError(t, err)
	call := srv.Calls()[0]
	require.Equal(t, "Bearer sk-test", call.Header.Get("Authorization"))
	require.JSONEq(t, `{
		"model": "claude-haiku-4-5",
		"stream": true,
		"max_tokens": 1024,
		"system": [{"type": "text", "text": "be brief\n\nno jokes"}],
		"messages": [
			{"role": "user", "content": [{"type": "text", "text": "hi"}]},
			{"role": "assistant", "content": [
				{"type": "text", "text": "let me look"},
				{"type": "tool_use", "id": "c1", "name": "lookup", "input": {"q": "x"}},
				{"type": "tool_use", "id": "c2", "name": "now", "input": {}}]},
			{"role": "user", "content": [
				{"type": "tool_result", "tool_use_id": "c1", "is_error": false, "content": [{"type": "text", "text": "found"}]},
				{"type": "tool_result", "tool_use_id": "c2", "is_error": false, "content": [{"type": "text", "text": "noon"}]},
				{"type": "text", "text": "and?"}]}
		],
		"tools": [
			{"name": "lookup", "description": "Look up", "input_schema": {"type": "object",
				"properties": {"q": {"type": "string"}}, "required": ["q"], "additionalProperties": false}},
			{"name": "now", "input_schema": {"type": "object", "properties": {}}}
		]
	}`, string(call.Body))
}

func TestMaxTokens(t *testing.T) {
	t.Setenv("ANTHROPIC_API_KEY", "must-not-be-read")
	srv := providertest.NewServer(t)
	p := anthropic.New(anthropic.Config{BaseURL: srv.AnthropicBaseURL()})
	_, err := p.Complete(context.Background(), provider.Request{Model: "m", MaxTokens: 77, IdempotencyKey: "k",
		Messages: []provider.Message{{Role: provider.RoleUser, Content: "hi"}}}, nil)
	require.NoError(t, err)
	var body struct {
		MaxTokens int `json:"max_tokens"`
	}
	require.NoError(t, json.Unmarshal(srv.Calls()[0].Body, &body))
	require.Equal(t, 77, body.MaxTokens)
	require.Empty(t, srv.Calls()[0].Header.Get("Authorization"), "New reads no environment")
	require.Empty(t, srv.Calls()[0].Header.Get("X-Api-Key"))
}

func TestResponseWithCacheUsage(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range []string{
			`{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-haiku-4-5",
				"content":[],"stop_reason":null,"stop_sequence":null,
				"usage":{"input_tokens":10,"cache_creation_input_tokens":100,"cache_read_input_tokens":1000,"output_tokens":1}}}`,
			`{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}`,
			`{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"hmm"}}`,
			`{"type":"content_block_stop","index":0}`,
			`{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}`,
			`{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"a"}}`,
			`{"type":"content_block_stop","index":1}`,
			`{"type":"content_block_start","index":2,"content_block":{"type":"text","text":""}}`,
			`{"type":"content_block_delta","index":2,"delta":{"type":"text_delta","text":"b"}}`,
			`{"type":"content_block_stop","index":2}`,
			`{"type":"content_block_start","index":3,"content_block":{"type":"tool_use","id":"t1","name":"f","input":{}}}`,
			`{"type":"content_block_delta","index":3,"delta":{"type":"input_json_delta","partial_json":"{\"x\":"}}`,
			`{"type":"content_block_delta","index":3,"delta":{"type":"input_json_delta","partial_json":"[1]}"}}`,
			`{"type":"content_block_stop","index":3}`,
			`{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},
				"usage":{"output_tokens":5,"output_tokens_details":{"thinking_tokens":2}}}`,
			`{"type":"message_stop"}`,
		} {
			var typ struct{ Type string }
			_ = json.Unmarshal([]byte(ev), &typ)
			_, _ = io.WriteString(w, "event: "+typ.Type+"\ndata: "+strings.Join(strings.Fields(ev), " ")+"\n\n")
		}
	}))
	defer srv.Close()
	p := anthropic.New(anthropic.Config{BaseURL: srv.URL})
	var deltas []provider.Delta
	resp, err := p.Complete(context.Background(), provider.Request{Model: "m", IdempotencyKey: "k",
		Messages: []provider.Message{{Role: provider.RoleUser, Content: "go"}}}, func(d provider.Delta) { deltas = append(deltas, d) })
	require.NoError(t, err)
	require.Equal(t, []provider.Delta{{Index: 0, Text: "hmm", Kind: provider.DeltaReasoning},
		{Index: 1, Text: "a", Kind: provider.DeltaText}, {Index: 2, Text: "b", Kind: provider.DeltaText}}, deltas)
	require.Equal(t, "msg_1", resp.ID)
	require.Equal(t, "claude-haiku-4-5", resp.Model)
	require.Equal(t, "ab", resp.Text)
	require.Equal(t, "tool_use", resp.FinishReason)
	require.Equal(t, provider.Usage{InputTokens: 1110, OutputTokens: 5, CacheWriteTokens: 100, CacheReadTokens: 1000,
		ReasoningTokens: 2}, resp.Usage)
	require.Len(t, resp.ToolCalls, 1)
	require.Equal(t, provider.ToolCall{ID: "t1", Name: "f", Arguments: json.RawMessage(`{"x":[1]}`)}, resp.ToolCalls[0])
}

func TestRefusedBeforeSending(t *testing.T) {
	srv := providertest.NewServer(t)
	p := anthropic.New(anthropic.Config{BaseURL: srv.AnthropicBaseURL()})
	for name, req := range map[string]provider.Request{
		"role":       {Model: "m", IdempotencyKey: "k", Messages: []provider.Message{{Role: "narrator", Content: "x"}}},
		"tool id":    {Model: "m", IdempotencyKey: "k", Messages: []provider.Message{{Role: provider.RoleTool, Content: "x"}}},
		"empty turn": {Model: "m", IdempotencyKey: "k", Messages: []provider.Message{{Role: provider.RoleAssistant}}},
		"parameters": {Model: "m", IdempotencyKey: "k", Tools: []provider.Tool{{Name: "f", Parameters: json.RawMessage(`"s"`)}}},
		"key":        {Model: "m", Messages: []provider.Message{{Role: provider.RoleUser, Content: "x"}}},
	} {
		_, err := p.Complete(context.Background(), req, nil)
		var pe *provider.Error
		require.ErrorAs(t, err, &pe, name)
		require.Equal(t, "anthropic", pe.Provider, name)
		require.False(t, pe.Retryable, name)
		require.False(t, pe.Unknown, name)
	}
	require.Empty(t, srv.Calls())
}

func TestFromEnv(t *testing.T) {
	srv := providertest.NewServer(t)
	t.Setenv("ANTHROPIC_BASE_URL", srv.AnthropicBaseURL())
	t.Setenv("ANTHROPIC_API_KEY", "from-env")
	p := anthropic.FromEnv()
	require.Equal(t, "anthropic", p.Name())
	resp, err := p.Complete(context.Background(), provider.Request{Model: "m", IdempotencyKey: "k",
		Messages: []provider.Message{{Role: provider.RoleUser, Content: "env"}}}, nil)
	require.NoError(t, err)
	require.Equal(t, "echo: env", resp.Text)
	require.Equal(t, "Bearer from-env", srv.Calls()[0].Header.Get("Authorization"))
	require.Equal(t, "/v1/messages", srv.Calls()[0].Path)
}
