package providertest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/palrun/pal/provider"
	"github.com/palrun/pal/provider/providertest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

type testBundle struct {
	srv *providertest.Server
	hc  *http.Client
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	srv := providertest.NewServer(t)
	hc := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	t.Cleanup(hc.CloseIdleConnections)
	return &testBundle{srv: srv, hc: hc}
}

type answer struct {
	status int
	body   map[string]any
	err    error
}

// post sends body to path with key as Idempotency-Key.
func (b *testBundle) post(ctx context.Context, path, key, body string) answer {
	h := http.Header{}
	if key != "" {
		h.Set("Idempotency-Key", key)
	}
	return b.postWith(ctx, path, h, body)
}

// postWith sends body to path with the headers h.
func (b *testBundle) postWith(ctx context.Context, path string, h http.Header, body string) answer {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.srv.URL()+path, strings.NewReader(body))
	if err != nil {
		return answer{err: err}
	}
	req.Header = h.Clone()
	req.Header.Set("Content-Type", "application/json")
	resp, err := b.hc.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{status: resp.StatusCode, err: err}
	}
	a := answer{status: resp.StatusCode}
	a.err = json.Unmarshal(raw, &a.body)
	return a
}

const (
	chatPath     = "/v1/chat/completions"
	messagesPath = "/v1/messages"
	chatBody     = `{"model":"gpt-4o-mini","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hello big world"}]}`
	messagesBody = `{"model":"claude-haiku-4-5","max_tokens":10,"system":"be brief","messages":[{"role":"user","content":"hello big world"}]}`
)

func TestEnv(t *testing.T) {
	t.Parallel()
	b := setup(t)
	u := b.srv.URL()
	require.True(t, strings.HasPrefix(u, "http://127.0.0.1:"))
	require.Equal(t, u+"/v1", b.srv.OpenAIBaseURL())
	require.Equal(t, u, b.srv.AnthropicBaseURL())
	require.Equal(t, []string{
		"OPENAI_BASE_URL=" + u + "/v1",
		"OPENAI_API_KEY=test",
		"ANTHROPIC_BASE_URL=" + u,
		"ANTHROPIC_API_KEY=test",
	}, b.srv.Env())
}

func TestStartAndCloseTwice(t *testing.T) {
	t.Parallel()
	srv, err := providertest.Start("127.0.0.1:0")
	require.NoError(t, err)
	srv.Close()
	srv.Close()
	_, err = providertest.Start("256.0.0.1:0")
	require.Error(t, err)
}

func TestDefaultAnswers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)

	a := b.post(ctx, chatPath, "k1", chatBody)
	require.NoError(t, a.err)
	require.Equal(t, http.StatusOK, a.status)
	require.Equal(t, "chat.completion", a.body["object"])
	require.Equal(t, "gpt-4o-mini", a.body["model"])
	choice := a.body["choices"].([]any)[0].(map[string]any)
	require.Equal(t, "stop", choice["finish_reason"])
	require.Equal(t, "echo: hello big world", choice["message"].(map[string]any)["content"])
	require.Equal(t, map[string]any{"prompt_tokens": 5.0, "completion_tokens": 4.0, "total_tokens": 9.0}, a.body["usage"])

	a = b.post(ctx, messagesPath, "k2", messagesBody)
	require.NoError(t, a.err)
	require.Equal(t, http.StatusOK, a.status)
	require.Equal(t, "message", a.body["type"])
	require.Equal(t, "end_turn", a.body["stop_reason"])
	require.Equal(t, []any{map[string]any{"type": "text", "text": "echo: hello big world"}}, a.body["content"])
	usage := a.body["usage"].(map[string]any)
	require.Equal(t, 5.0, usage["input_tokens"])
	require.Equal(t, 4.0, usage["output_tokens"])

	calls := b.srv.Calls()
	require.Len(t, calls, 2)
	for i, c := range calls {
		require.Equal(t, "be brief", c.System)
		require.Equal(t, []provider.Message{{Role: provider.RoleUser, Content: "hello big world"}}, c.Messages)
		require.False(t, c.At.IsZero())
		require.NotEmpty(t, c.Body)
		require.Equal(t, "application/json", c.Header.Get("Content-Type"))
		require.Equal(t, []string{"k1", "k2"}[i], c.IdempotencyKey)
	}
	require.Equal(t, providertest.OpenAI, calls[0].Provider)
	require.Equal(t, chatPath, calls[0].Path)
	require.Equal(t, providertest.Anthropic, calls[1].Provider)
	require.Equal(t, messagesPath, calls[1].Path)
}

func TestParse(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)

	// Content parts, tool calls and tool results in the OpenAI format.
	a := b.post(ctx, chatPath, "", `{"model":"m","messages":[
		{"role":"developer","content":[{"type":"text","text":"rules"}]},
		{"role":"user","content":[{"type":"text","text":"a "},{"type":"text","text":"b"}]},
		{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"x\":1}"}}]},
		{"role":"tool","tool_call_id":"c1","content":"done"}],
		"tools":[{"type":"function","function":{"name":"f"}}]}`)
	require.NoError(t, a.err)
	require.Equal(t, http.StatusOK, a.status)

	// Blocks in the Anthropic format.
	a = b.post(ctx, messagesPath, "", `{"model":"m","max_tokens":5,
		"system":[{"type":"text","text":"rules"}],
		"messages":[
		{"role":"user","content":[{"type":"text","text":"a "},{"type":"text","text":"b"}]},
		{"role":"assistant","content":[{"type":"tool_use","id":"c1","name":"f","input":{"x":1}}]},
		{"role":"user","content":[{"type":"tool_result","tool_use_id":"c1","content":[{"type":"text","text":"done"}]}]}],
		"tools":[{"name":"f","input_schema":{"type":"object"}}]}`)
	require.NoError(t, a.err)
	require.Equal(t, http.StatusOK, a.status)

	for _, c := range b.srv.Calls() {
		require.Equal(t, "rules", c.System, c.Provider)
		require.Equal(t, []string{"f"}, c.Tools, c.Provider)
		require.Len(t, c.Messages, 3, c.Provider)
		require.Equal(t, provider.Message{Role: provider.RoleUser, Content: "a b"}, c.Messages[0], c.Provider)
		require.Equal(t, provider.RoleAssistant, c.Messages[1].Role, c.Provider)
		require.Len(t, c.Messages[1].ToolCalls, 1, c.Provider)
		require.Equal(t, "c1", c.Messages[1].ToolCalls[0].ID)
		require.JSONEq(t, `{"x":1}`, string(c.Messages[1].ToolCalls[0].Arguments))
		require.Equal(t, provider.Message{Role: provider.RoleTool, ToolCallID: "c1", Content: "done"}, c.Messages[2], c.Provider)
		require.Equal(t, "a b", c.LastUser())
	}
}

func TestBadRequests(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)

	a := b.post(ctx, "/v1/embeddings", "", `{}`)
	require.Equal(t, http.StatusNotFound, a.status)
	require.Contains(t, a.body["error"].(map[string]any)["message"], "no route")

	a = b.post(ctx, chatPath, "", `not json`)
	require.Equal(t, http.StatusBadRequest, a.status)
	require.Contains(t, a.body["error"], "message")

	a = b.post(ctx, chatPath, "", `{"model":"m","messages":[],"response_format":{"type":"json_schema","json_schema":{"name":"r","schema":{}}}}`)
	require.Equal(t, http.StatusBadRequest, a.status)
	require.Contains(t, a.body["error"].(map[string]any)["message"], "strict")

	resp, err := b.hc.Get(b.srv.URL() + chatPath)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)

	require.Len(t, b.srv.Calls(), 2, "only requests that reach a route are recorded")
	a = b.post(ctx, messagesPath, "", `{"model":"m","messages":[{"role":"user","content":[{"type":"image","source":{"type":"file"}}]}]}`)
	require.Equal(t, http.StatusBadRequest, a.status)
	require.Equal(t, "error", a.body["type"])
}

func TestResponder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.srv.SetResponder(func(c providertest.Call) providertest.Reply {
		switch c.LastUser() {
		case "tool":
			return providertest.Reply{ToolCalls: []provider.ToolCall{{Name: "f", Arguments: json.RawMessage(`{"a":1}`)}}}
		case "fail":
			return providertest.Reply{Status: http.StatusTooManyRequests}
		}
		return providertest.Reply{Text: "scripted", InputTokens: 7, OutputTokens: 8}
	})
	body := func(path, text string) string {
		if path == chatPath {
			return `{"model":"m","messages":[{"role":"user","content":"` + text + `"}]}`
		}
		return `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"` + text + `"}]}`
	}

	a := b.post(ctx, chatPath, "", body(chatPath, "tool"))
	require.NoError(t, a.err)
	msg := a.body["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)
	require.Nil(t, msg["content"])
	call := msg["tool_calls"].([]any)[0].(map[string]any)
	require.NotEmpty(t, call["id"], "a missing tool call id is made up")
	require.Equal(t, "function", call["type"])
	require.JSONEq(t, `{"a":1}`, call["function"].(map[string]any)["arguments"].(string))

	a = b.post(ctx, messagesPath, "", body(messagesPath, "tool"))
	require.NoError(t, a.err)
	require.Equal(t, "tool_use", a.body["stop_reason"])
	block := a.body["content"].([]any)[0].(map[string]any)
	require.Equal(t, "tool_use", block["type"])
	require.NotEmpty(t, block["id"])
	require.Equal(t, map[string]any{"a": 1.0}, block["input"])

	a = b.post(ctx, chatPath, "", body(chatPath, "fail"))
	require.Equal(t, http.StatusTooManyRequests, a.status)
	require.Equal(t, "rate_limit_exceeded", a.body["error"].(map[string]any)["type"])
	a = b.post(ctx, messagesPath, "", body(messagesPath, "fail"))
	require.Equal(t, http.StatusTooManyRequests, a.status)
	require.Equal(t, "rate_limit_error", a.body["error"].(map[string]any)["type"])

	a = b.post(ctx, chatPath, "", body(chatPath, "hi"))
	require.Equal(t, map[string]any{"prompt_tokens": 7.0, "completion_tokens": 8.0, "total_tokens": 15.0}, a.body["usage"])

	b.srv.SetResponder(nil)
	a = b.post(ctx, messagesPath, "", body(messagesPath, "hi"))
	require.Equal(t, "echo: hi", a.body["content"].([]any)[0].(map[string]any)["text"])
}

func TestFailNextAndDrop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.srv.FailNext(providertest.ByProvider(providertest.Anthropic), http.StatusServiceUnavailable, 2)
	b.srv.Drop(providertest.ByKey("drop"), 1)

	a := b.post(ctx, chatPath, "", chatBody)
	require.Equal(t, http.StatusOK, a.status, "OpenAI requests do not match")
	for range 2 {
		a = b.post(ctx, messagesPath, "", messagesBody)
		require.Equal(t, http.StatusServiceUnavailable, a.status)
		require.Equal(t, "error", a.body["type"])
		require.Equal(t, "api_error", a.body["error"].(map[string]any)["type"])
	}
	a = b.post(ctx, messagesPath, "", messagesBody)
	require.Equal(t, http.StatusOK, a.status, "the fault is spent")

	// On a fresh connection: net/http resends a request that carries an
	// Idempotency-Key by itself when a reused connection breaks.
	fresh := &testBundle{srv: b.srv, hc: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}}
	a = fresh.post(ctx, chatPath, "drop", chatBody)
	require.Error(t, a.err)
	require.Zero(t, a.status)
	a = fresh.post(ctx, chatPath, "drop", chatBody)
	require.Equal(t, http.StatusOK, a.status)

	require.Equal(t, map[string]int{"drop": 2}, b.srv.Keys())
	require.Len(t, b.srv.Calls(), 6, "failed and dropped requests are recorded")
}

func TestReset(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.srv.Dedup(true)
	b.post(ctx, chatPath, "k", chatBody)
	b.srv.FailNext(nil, http.StatusInternalServerError, 1)
	b.srv.Reset()
	require.Empty(t, b.srv.Calls())
	require.Empty(t, b.srv.Keys())

	var n atomic.Int64
	b.srv.SetResponder(func(providertest.Call) providertest.Reply {
		n.Add(1)
		return providertest.Reply{Text: "fresh"}
	})
	a := b.post(ctx, chatPath, "k", chatBody)
	require.Equal(t, http.StatusOK, a.status, "the FailNext rule is gone")
	require.Equal(t, int64(1), n.Load(), "the kept answer is gone")
	require.Len(t, b.srv.CallsWithKey("k"), 1)
}

func TestDedup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.srv.Dedup(true)
	var n atomic.Int64
	b.srv.SetResponder(func(providertest.Call) providertest.Reply {
		if n.Add(1) == 1 {
			return providertest.Reply{Status: http.StatusInternalServerError}
		}
		return providertest.Reply{Text: "ok"}
	})

	a := b.post(ctx, messagesPath, "k", messagesBody)
	require.Equal(t, http.StatusInternalServerError, a.status)
	first := b.post(ctx, messagesPath, "k", messagesBody)
	require.Equal(t, http.StatusOK, first.status, "an error is not kept")
	again := b.post(ctx, messagesPath, "k", messagesBody)
	require.Equal(t, first, again)
	require.Equal(t, int64(2), n.Load())
	require.Equal(t, 3, b.srv.Keys()["k"])

	// Without a key there is nothing to deduplicate.
	b.post(ctx, messagesPath, "", messagesBody)
	b.post(ctx, messagesPath, "", messagesBody)
	require.Equal(t, int64(4), n.Load())

	b.srv.Dedup(false)
	b.post(ctx, messagesPath, "k", messagesBody)
	require.Equal(t, int64(5), n.Load())
}

func TestHoldQueue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	hold := b.srv.Hold(providertest.ByProvider(providertest.OpenAI))

	done := make(chan answer, 2)
	for _, k := range []string{"a", "b"} {
		go func() { done <- b.post(ctx, chatPath, k, chatBody) }()
	}
	seen := map[string]bool{}
	for range 2 {
		c, err := hold.Wait(ctx)
		require.NoError(t, err)
		seen[c.IdempotencyKey] = true
	}
	require.Equal(t, map[string]bool{"a": true, "b": true}, seen, "each arrival is reported once")

	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err := hold.Wait(short)
	require.ErrorIs(t, err, context.DeadlineExceeded, "no third arrival")

	// Requests that do not match pass.
	a := b.post(ctx, messagesPath, "c", messagesBody)
	require.Equal(t, http.StatusOK, a.status)
	require.Empty(t, done)

	hold.Release()
	hold.Release()
	for range 2 {
		a := <-done
		require.NoError(t, a.err)
		require.Equal(t, http.StatusOK, a.status)
	}
	_, err = hold.Wait(ctx)
	require.ErrorIs(t, err, providertest.ErrReleased)

	// A released hold holds nothing.
	a = b.post(ctx, chatPath, "d", chatBody)
	require.Equal(t, http.StatusOK, a.status)
}

func TestHoldReportsArrivalsAfterRelease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	hold := b.srv.Hold(nil)
	done := make(chan answer, 1)
	go func() { done <- b.post(ctx, chatPath, "a", chatBody) }()
	// Wait for the arrival through the record, not through the hold.
	require.Eventually(t, func() bool { return len(b.srv.Calls()) == 1 }, 5*time.Second, time.Millisecond)
	hold.Release()
	require.Equal(t, http.StatusOK, (<-done).status)
	c, err := hold.Wait(ctx)
	require.NoError(t, err)
	require.Equal(t, "a", c.IdempotencyKey)
}

func TestHeldRequestEndsWhenClientLeaves(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.srv.Dedup(true)
	var first atomic.Bool
	hold := b.srv.Hold(func(providertest.Call) bool { return first.CompareAndSwap(false, true) })
	defer hold.Release()

	cctx, cancel := context.WithCancel(ctx)
	done := make(chan answer, 1)
	go func() { done <- b.post(cctx, chatPath, "k", chatBody) }()
	_, err := hold.Wait(ctx)
	require.NoError(t, err)

	a := b.post(ctx, chatPath, "k", chatBody)
	require.Equal(t, http.StatusConflict, a.status, "the held request owns its key")

	cancel()
	require.ErrorIs(t, (<-done).err, context.Canceled)
	// Once the held handler has ended, the key is free again.
	require.Eventually(t, func() bool {
		return b.post(ctx, chatPath, "k", chatBody).status == http.StatusOK
	}, 5*time.Second, 5*time.Millisecond)
}

func TestCloseEndsHeldRequests(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv, err := providertest.New()
	require.NoError(t, err)
	hc := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	defer hc.CloseIdleConnections()
	hold := srv.Hold(nil)

	done := make(chan error, 1)
	go func() {
		resp, err := hc.Post(srv.URL()+chatPath, "application/json", bytes.NewReader([]byte(chatBody)))
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	_, err = hold.Wait(ctx)
	require.NoError(t, err)

	srv.Close()
	require.Error(t, <-done, "a held request gets no answer")
	_, err = hold.Wait(ctx)
	require.ErrorIs(t, err, providertest.ErrClosed)
}

// TestInFlightAnsweredAbandoned: InFlight counts the held requests, a
// request whose client gives up is abandoned, a released one answered.
func TestInFlightAnsweredAbandoned(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	hold := b.srv.Hold(nil)
	gone, cancel := context.WithCancel(ctx)
	done := make(chan answer, 2)
	go func() { done <- b.post(gone, chatPath, "cut", chatBody) }()
	go func() { done <- b.post(ctx, chatPath, "kept", chatBody) }()
	for range 2 {
		_, err := hold.Wait(ctx)
		require.NoError(t, err)
	}
	require.Equal(t, 2, b.srv.InFlight())
	cancel()
	<-done
	require.Eventually(t, func() bool { return len(b.srv.Abandoned()) == 1 }, 5*time.Second, time.Millisecond)
	require.Equal(t, "cut", b.srv.Abandoned()[0].IdempotencyKey)
	require.Empty(t, b.srv.Answered())
	hold.Release()
	require.Equal(t, http.StatusOK, (<-done).status)
	require.Equal(t, "kept", b.srv.Answered()[0].IdempotencyKey)
	require.Len(t, b.srv.Answered(), 1)
	require.Eventually(t, func() bool { return b.srv.InFlight() == 0 }, 5*time.Second, time.Millisecond)
	require.Equal(t, 2, b.srv.MaxConcurrent())
}

// events reads a server-sent event stream: each event's name ("" for none)
// and data.
func events(t *testing.T, body io.Reader) [][2]string {
	t.Helper()
	raw, err := io.ReadAll(body)
	require.NoError(t, err)
	var out [][2]string
	for _, block := range strings.Split(strings.TrimSuffix(string(raw), "\n\n"), "\n\n") {
		var ev [2]string
		for _, line := range strings.Split(block, "\n") {
			if v, ok := strings.CutPrefix(line, "event: "); ok {
				ev[0] = v
			}
			if v, ok := strings.CutPrefix(line, "data: "); ok {
				ev[1] = v
			}
		}
		out = append(out, ev)
	}
	return out
}

// TestStreamedAnswers: a request that asks for a stream is answered with
// the events its API streams, a delta per word.
func TestStreamedAnswers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.srv.SetResponder(func(providertest.Call) providertest.Reply {
		return providertest.Reply{Text: "one two", CacheReadTokens: 2, InputTokens: 5}
	})
	stream := func(path, body string) [][2]string {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.srv.URL()+path, strings.NewReader(body))
		require.NoError(t, err)
		resp, err := b.hc.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
		return events(t, resp.Body)
	}

	var observed []int
	b.srv.OnDelta(func(_ providertest.Call, i int) { observed = append(observed, i) })
	evs := stream(chatPath, `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`)
	require.Len(t, evs, 6, "role, two words, finish, usage, [DONE]")
	require.Equal(t, []int{0, 1}, observed, "each delta once it is flushed")
	b.srv.OnDelta(nil)
	var chunk struct {
		Object  string `json:"object"`
		Choices []struct {
			Delta struct {
				Content string `json:"content"`
			} `json:"delta"`
			FinishReason *string `json:"finish_reason"`
		} `json:"choices"`
		Usage map[string]any `json:"usage"`
	}
	require.NoError(t, json.Unmarshal([]byte(evs[2][1]), &chunk))
	require.Equal(t, "chat.completion.chunk", chunk.Object)
	require.Equal(t, " two", chunk.Choices[0].Delta.Content)
	require.NoError(t, json.Unmarshal([]byte(evs[4][1]), &chunk))
	require.Equal(t, map[string]any{"prompt_tokens": 5.0, "completion_tokens": 2.0, "total_tokens": 7.0,
		"prompt_tokens_details": map[string]any{"cached_tokens": 2.0}}, chunk.Usage)
	require.Equal(t, "[DONE]", evs[5][1])

	evs = stream(messagesPath, `{"model":"m","max_tokens":9,"stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	var names []string
	for _, ev := range evs {
		names = append(names, ev[0])
	}
	require.Equal(t, []string{"message_start", "content_block_start", "content_block_delta", "content_block_delta",
		"content_block_stop", "message_delta", "message_stop"}, names)
	require.Contains(t, evs[0][1], `"input_tokens":3`, "input_tokens is the uncached part")
	require.Contains(t, evs[0][1], `"cache_read_input_tokens":2`)
	require.Contains(t, evs[3][1], `"text":" two"`)
	calls := b.srv.Calls()
	require.True(t, calls[0].Stream && calls[1].Stream)
	require.Equal(t, 9, calls[1].MaxTokens)
}

// TestHoldAfterWithoutStream: a request that is not streamed is held by a
// HoldAfter before it is answered, as by Hold.
func TestHoldAfterWithoutStream(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	hold := b.srv.HoldAfter(nil, 3)
	done := make(chan answer, 1)
	go func() { done <- b.post(ctx, chatPath, "k", chatBody) }()
	_, err := hold.Wait(ctx)
	require.NoError(t, err)
	select {
	case a := <-done:
		t.Fatalf("answered while held: %+v", a)
	default:
	}
	hold.Release()
	a := <-done
	require.NoError(t, a.err)
	require.Equal(t, http.StatusOK, a.status)
}

// TestStreamLeftMidway: a stream held midway is in flight; its client
// going away there abandons it, and a stream written whole is answered.
func TestStreamLeftMidway(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	hold := b.srv.HoldAfter(providertest.ByKey("cut"), 1)
	stream := func(ctx context.Context, key string) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.srv.URL()+chatPath,
			strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"one two three"}]}`))
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", key)
		resp, err := b.hc.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		_, err = io.ReadAll(resp.Body)
		return err
	}
	gone, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- stream(gone, "cut") }()
	_, err := hold.Wait(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, b.srv.InFlight(), "held midway, still in flight")
	cancel()
	require.Error(t, <-done)
	require.Eventually(t, func() bool { return len(b.srv.Abandoned()) == 1 }, 5*time.Second, time.Millisecond)
	require.Equal(t, "cut", b.srv.Abandoned()[0].IdempotencyKey)
	require.Empty(t, b.srv.Answered())
	require.Eventually(t, func() bool { return b.srv.InFlight() == 0 }, 5*time.Second, time.Millisecond)

	require.NoError(t, stream(ctx, "whole"))
	require.Len(t, b.srv.Answered(), 1)
	require.Equal(t, "whole", b.srv.Answered()[0].IdempotencyKey)
	require.Len(t, b.srv.Abandoned(), 1)
	require.Equal(t, 0, b.srv.InFlight(), "out of flight once its last event is written")
}
