package openai_test

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
	"github.com/palrun/pal/provider/openai"
	"github.com/palrun/pal/provider/providertest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// The behaviour both adapters share is tested by TestAdapters in package
// provider; these tests cover what is particular to the Chat Completions
// wire format.

// sse serves every request with a stream of the chunks, then [DONE].
func sse(t *testing.T, chunks ...string) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, c := range chunks {
			_, _ = io.WriteString(w, "data: "+strings.Join(strings.Fields(c), " ")+"\n\n")
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestRequestBody(t *testing.T) {
	srv := providertest.NewServer(t)
	p := openai.New(openai.Config{APIKey: "sk-test", BaseURL: srv.OpenAIBaseURL()})
	temp := 0.25
	_, err := p.Complete(context.Background(), provider.Request{
		Model:          "gpt-4o-mini",
		System:         "be brief",
		MaxTokens:      64,
		Temperature:    &temp,
		IdempotencyKey: "k",
		Tools: []provider.Tool{{Name: "lookup", Description: "Look up", Parameters: json.RawMessage(
			`{"type":"object","properties":{"q":{"type":"string"}},"required":["q"]}`)}},
		Messages: []provider.Message{
			{Role: provider.RoleUser, Content: "hi"},
			{Role: provider.RoleAssistant, Content: "let me look", ToolCalls: []provider.ToolCall{{ID: "c1", Name: "lookup", Arguments: json.RawMessage(`{"q":"x"}`)}}},
			{Role: provider.RoleTool, ToolCallID: "c1", Content: "found"},
		},
	}, nil)
	require.NoError(t, err)
	call := srv.Calls()[0]
	require.Equal(t, "Bearer sk-test", call.Header.Get("Authorization"))
	require.JSONEq(t, `{
		"model": "gpt-4o-mini",
		"stream": true,
		"stream_options": {"include_usage": true},
		"max_completion_tokens": 64,
		"temperature": 0.25,
		"messages": [
			{"role": "system", "content": "be brief"},
			{"role": "user", "content": "hi"},
			{"role": "assistant", "content": "let me look", "tool_calls": [
				{"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{\"q\":\"x\"}"}}]},
			{"role": "tool", "tool_call_id": "c1", "content": "found"}
		],
		"tools": [{"type": "function", "function": {"name": "lookup", "description": "Look up",
			"parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}]
	}`, string(call.Body))
}

func TestInvalidToolArgumentsStayJSON(t *testing.T) {
	// Models can emit tool arguments that are not JSON; the response must
	// still encode, so they are kept as a JSON string.
	srv := sse(t,
		`{"id":"x","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant",
			"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"f","arguments":"{not json"}},
			              {"index":1,"id":"c2","type":"function","function":{"name":"g","arguments":""}}]}}]}`,
		`{"id":"x","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`,
		`{"id":"x","object":"chat.completion.chunk","created":1,"model":"m","choices":[],
			"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`)
	p := openai.New(openai.Config{BaseURL: srv.URL})
	resp, err := p.Complete(context.Background(), provider.Request{Model: "m", IdempotencyKey: "k",
		Messages: []provider.Message{{Role: provider.RoleUser, Content: "go"}}}, nil)
	require.NoError(t, err)
	require.Len(t, resp.ToolCalls, 2)
	require.JSONEq(t, `"{not json"`, string(resp.ToolCalls[0].Arguments))
	require.JSONEq(t, `{}`, string(resp.ToolCalls[1].Arguments))
	_, err = json.Marshal(resp)
	require.NoError(t, err)
}

func TestNoChoicesIsRetryable(t *testing.T) {
	srv := sse(t, `{"id":"x","object":"chat.completion.chunk","created":1,"model":"m","choices":[]}`)
	p := openai.New(openai.Config{BaseURL: srv.URL})
	_, err := p.Complete(context.Background(), provider.Request{Model: "m", IdempotencyKey: "k",
		Messages: []provider.Message{{Role: provider.RoleUser, Content: "go"}}}, nil)
	var pe *provider.Error
	require.ErrorAs(t, err, &pe)
	require.True(t, pe.Retryable)
	require.False(t, pe.Unknown)
}

func TestRefusedBeforeSending(t *testing.T) {
	srv := providertest.NewServer(t)
	p := openai.New(openai.Config{BaseURL: srv.OpenAIBaseURL()})
	for name, req := range map[string]provider.Request{
		"role":       {Model: "m", IdempotencyKey: "k", Messages: []provider.Message{{Role: "narrator", Content: "x"}}},
		"tool id":    {Model: "m", IdempotencyKey: "k", Messages: []provider.Message{{Role: provider.RoleTool, Content: "x"}}},
		"parameters": {Model: "m", IdempotencyKey: "k", Tools: []provider.Tool{{Name: "f", Parameters: json.RawMessage(`[1]`)}}},
		"key":        {Model: "m", Messages: []provider.Message{{Role: provider.RoleUser, Content: "x"}}},
	} {
		_, err := p.Complete(context.Background(), req, nil)
		var pe *provider.Error
		require.ErrorAs(t, err, &pe, name)
		require.False(t, pe.Retryable, name)
		require.False(t, pe.Unknown, name)
	}
	require.Empty(t, srv.Calls())
}

func TestFromEnv(t *testing.T) {
	srv := providertest.NewServer(t)
	t.Setenv("OPENAI_BASE_URL", srv.OpenAIBaseURL())
	t.Setenv("OPENAI_API_KEY", "from-env")
	p := openai.FromEnv()
	require.Equal(t, "openai", p.Name())
	resp, err := p.Complete(context.Background(), provider.Request{Model: "m", IdempotencyKey: "k",
		Messages: []provider.Message{{Role: provider.RoleUser, Content: "env"}}}, nil)
	require.NoError(t, err)
	require.Equal(t, "echo: env", resp.Text)
	require.Equal(t, "Bearer from-env", srv.Calls()[0].Header.Get("Authorization"))
	require.Equal(t, "/v1/chat/completions", srv.Calls()[0].Path)
}

func TestNoKeyNoCredential(t *testing.T) {
	t.Setenv("OPENAI_API_KEY", "must-not-be-read")
	srv := providertest.NewServer(t)
	p := openai.New(openai.Config{BaseURL: srv.OpenAIBaseURL()})
	_, err := p.Complete(context.Background(), provider.Request{Model: "m", IdempotencyKey: "k",
		Messages: []provider.Message{{Role: provider.RoleUser, Content: "x"}}}, nil)
	require.NoError(t, err)
	require.Empty(t, srv.Calls()[0].Header.Get("Authorization"))
}
