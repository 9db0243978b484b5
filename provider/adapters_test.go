package provider_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/palrun/pal/provider"
	"github.com/palrun/pal/provider/anthropic"
	"github.com/palrun/pal/provider/openai"
	"github.com/palrun/pal/provider/providertest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// adapter is one provider implementation under test, built against the
// fake server.
type adapter struct {
	name string
	// finish is the finish reason of a plain answer and of one with tool calls.
	finish, finishTools string
	// new builds the provider for baseURL (the server's root) and hc.
	new func(root string, hc *http.Client) provider.Provider
	// dev builds it for pal dev's fake provider (Config.DevFake).
	dev func(root string, hc *http.Client) provider.Provider
}

var adapters = []adapter{
	{
		name: "openai", finish: "stop", finishTools: "tool_calls",
		new: func(root string, hc *http.Client) provider.Provider {
			return openai.New(openai.Config{APIKey: "test", BaseURL: root + "/v1", HTTPClient: hc})
		},
		dev: func(root string, hc *http.Client) provider.Provider {
			return openai.New(openai.Config{APIKey: "test", BaseURL: root + "/v1", HTTPClient: hc, DevFake: true})
		},
	},
	{
		name: "anthropic", finish: "end_turn", finishTools: "tool_use",
		new: func(root string, hc *http.Client) provider.Provider {
			return anthropic.New(anthropic.Config{APIKey: "test", BaseURL: root, HTTPClient: hc})
		},
		dev: func(root string, hc *http.Client) provider.Provider {
			return anthropic.New(anthropic.Config{APIKey: "test", BaseURL: root, HTTPClient: hc, DevFake: true})
		},
	},
}

// TestAdapters runs the same assertions against every adapter.
func TestAdapters(t *testing.T) {
	t.Parallel()
	for _, a := range adapters {
		t.Run(a.name, func(t *testing.T) {
			t.Parallel()
			exercise(t, a)
		})
	}
}

// TestAdaptersFakeHeader: a request's Fake reaches the server as the
// X-Pal-Fake, X-Pal-Fake-Step and X-Pal-Fake-Turn headers only from an
// adapter configured for pal dev's fake (DevFake); the fake then answers
// from the block.
// Without DevFake the headers are never sent, and the answer is the
// fake's default.
func TestAdaptersFakeHeader(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, a := range adapters {
		t.Run(a.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, a)
			req := hello(key(t))
			req.Fake = &provider.Fake{Script: `{"turns":[{"text":"scripted"}]}`, Step: "run1/ask"}

			resp, err := b.p.Complete(ctx, req, nil)
			require.NoError(t, err)
			require.Equal(t, "echo: hello there", resp.Text)
			call := b.srv.Calls()[0]
			require.Empty(t, call.Header.Values(provider.FakeHeader), "not sent without DevFake")
			require.Empty(t, call.Header.Values(provider.FakeStepHeader))
			require.Empty(t, call.Header.Values(provider.FakeTurnHeader))

			dev := a.dev(b.srv.URL(), b.hc)
			resp, err = dev.Complete(ctx, req, nil)
			require.NoError(t, err)
			require.Equal(t, "scripted", resp.Text)
			call = b.srv.Calls()[1]
			require.Equal(t, req.Fake.Script, call.Header.Get(provider.FakeHeader))
			require.Equal(t, "run1/ask", call.Header.Get(provider.FakeStepHeader))
			require.Equal(t, "0", call.Header.Get(provider.FakeTurnHeader))

			// DevFake and no Fake on the request: nothing sent.
			_, err = dev.Complete(ctx, hello(key(t)), nil)
			require.NoError(t, err)
			require.Empty(t, b.srv.Calls()[2].Header.Values(provider.FakeHeader))
		})
	}
}

type testBundle struct {
	srv *providertest.Server
	p   provider.Provider
	hc  *http.Client
}

func setup(t *testing.T, a adapter) *testBundle {
	t.Helper()
	srv := providertest.NewServer(t)
	hc := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	t.Cleanup(hc.CloseIdleConnections)
	return &testBundle{srv: srv, p: a.new(srv.URL(), hc), hc: hc}
}

var keySeq atomic.Int64

// key returns a fresh idempotency key shaped like PAL's.
func key(t *testing.T) string {
	sum := sha256.Sum256(fmt.Appendf(nil, "%s|step|%d", t.Name(), keySeq.Add(1)))
	return hex.EncodeToString(sum[:])
}

func hello(k string) provider.Request {
	return provider.Request{
		Model:          "test-model",
		Messages:       []provider.Message{{Role: provider.RoleUser, Content: "hello there"}},
		IdempotencyKey: k,
	}
}

// requireError asserts that err is a *provider.Error of the named provider
// and returns it.
func requireError(t *testing.T, name string, err error) *provider.Error {
	t.Helper()
	require.Error(t, err)
	var pe *provider.Error
	require.ErrorAs(t, err, &pe)
	require.Equal(t, name, pe.Provider)
	return pe
}

func exercise(t *testing.T, a adapter) {
	ctx := context.Background()

	t.Run("Name", func(t *testing.T) {
		t.Parallel()
		b := setup(t, a)
		require.Equal(t, a.name, b.p.Name())
	})

	t.Run("PlainText", func(t *testing.T) {
		t.Parallel()
		b := setup(t, a)
		k := key(t)
		resp, err := b.p.Complete(ctx, hello(k), nil)
		require.NoError(t, err)
		require.Equal(t, "echo: hello there", resp.Text)
		require.Equal(t, "test-model", resp.Model)
		require.NotEmpty(t, resp.ID)
		require.Equal(t, a.finish, resp.FinishReason)
		require.Empty(t, resp.ToolCalls)
		require.Equal(t, provider.Usage{InputTokens: 2, OutputTokens: 3}, resp.Usage)

		calls := b.srv.Calls()
		require.Len(t, calls, 1)
		require.Equal(t, a.name, calls[0].Provider)
		require.Equal(t, "test-model", calls[0].Model)
		require.Equal(t, []provider.Message{{Role: provider.RoleUser, Content: "hello there"}}, calls[0].Messages)
		require.Empty(t, calls[0].System)
	})

	t.Run("SystemPrompt", func(t *testing.T) {
		t.Parallel()
		b := setup(t, a)
		req := hello(key(t))
		req.System = "answer in one word"
		resp, err := b.p.Complete(ctx, req, nil)
		require.NoError(t, err)
		require.Equal(t, provider.Usage{InputTokens: 6, OutputTokens: 3}, resp.Usage)

		calls := b.srv.Calls()
		require.Len(t, calls, 1)
		require.Equal(t, "answer in one word", calls[0].System)
		require.Equal(t, []provider.Message{{Role: provider.RoleUser, Content: "hello there"}}, calls[0].Messages)
	})

	t.Run("MultiTurn", func(t *testing.T) {
		t.Parallel()
		b := setup(t, a)
		req := hello(key(t))
		req.Messages = []provider.Message{
			{Role: provider.RoleUser, Content: "first"},
			{Role: provider.RoleAssistant, Content: "echo: first"},
			{Role: provider.RoleUser, Content: "second"},
		}
		resp, err := b.p.Complete(ctx, req, nil)
		require.NoError(t, err)
		require.Equal(t, "echo: second", resp.Text)
		require.Equal(t, req.Messages, b.srv.Calls()[0].Messages)
	})

	t.Run("ToolCallsRoundTrip", func(t *testing.T) {
		t.Parallel()
		b := setup(t, a)
		b.srv.SetResponder(func(c providertest.Call) providertest.Reply {
			if len(c.Messages) == 1 {
				return providertest.Reply{ToolCalls: []provider.ToolCall{
					{ID: "call_1", Name: "get_weather", Arguments: json.RawMessage(`{"city":"Oslo","days":2}`)},
					{ID: "call_2", Name: "get_time", Arguments: json.RawMessage(`{}`)},
				}}
			}
			return providertest.Reply{Text: "rainy"}
		})
		tools := []provider.Tool{
			{Name: "get_weather", Description: "Weather by city", Parameters: json.RawMessage(
				`{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}},"required":["city"]}`)},
			{Name: "get_time"},
		}
		req := hello(key(t))
		req.Tools = tools
		resp, err := b.p.Complete(ctx, req, nil)
		require.NoError(t, err)
		require.Equal(t, a.finishTools, resp.FinishReason)
		require.Empty(t, resp.Text)
		require.Len(t, resp.ToolCalls, 2)
		require.Equal(t, "call_1", resp.ToolCalls[0].ID)
		require.Equal(t, "get_weather", resp.ToolCalls[0].Name)
		require.JSONEq(t, `{"city":"Oslo","days":2}`, string(resp.ToolCalls[0].Arguments))
		require.Equal(t, "get_time", resp.ToolCalls[1].Name)
		require.JSONEq(t, `{}`, string(resp.ToolCalls[1].Arguments))
		require.Equal(t, []string{"get_weather", "get_time"}, b.srv.Calls()[0].Tools)

		// Send the calls back with their results.
		next := hello(key(t))
		next.Tools = tools
		next.Messages = append(next.Messages,
			provider.Message{Role: provider.RoleAssistant, ToolCalls: resp.ToolCalls},
			provider.Message{Role: provider.RoleTool, ToolCallID: "call_1", Content: "rain"},
			provider.Message{Role: provider.RoleTool, ToolCallID: "call_2", Content: "noon"},
		)
		resp, err = b.p.Complete(ctx, next, nil)
		require.NoError(t, err)
		require.Equal(t, "rainy", resp.Text)

		got := b.srv.Calls()[1].Messages
		require.Len(t, got, 4)
		require.Equal(t, provider.Message{Role: provider.RoleUser, Content: "hello there"}, got[0])
		require.Equal(t, provider.RoleAssistant, got[1].Role)
		require.Len(t, got[1].ToolCalls, 2)
		require.Equal(t, "call_1", got[1].ToolCalls[0].ID)
		require.Equal(t, "get_weather", got[1].ToolCalls[0].Name)
		require.JSONEq(t, `{"city":"Oslo","days":2}`, string(got[1].ToolCalls[0].Arguments))
		require.Equal(t, provider.Message{Role: provider.RoleTool, ToolCallID: "call_1", Content: "rain"}, got[2])
		require.Equal(t, provider.Message{Role: provider.RoleTool, ToolCallID: "call_2", Content: "noon"}, got[3])
	})

	t.Run("Usage", func(t *testing.T) {
		t.Parallel()
		b := setup(t, a)
		b.srv.SetResponder(func(providertest.Call) providertest.Reply {
			return providertest.Reply{Text: "ok", InputTokens: 1234, OutputTokens: 56}
		})
		resp, err := b.p.Complete(ctx, hello(key(t)), nil)
		require.NoError(t, err)
		require.Equal(t, provider.Usage{InputTokens: 1234, OutputTokens: 56}, resp.Usage)
	})

	t.Run("IdempotencyKeyHeader", func(t *testing.T) {
		t.Parallel()
		b := setup(t, a)
		k := key(t)
		_, err := b.p.Complete(ctx, hello(k), nil)
		require.NoError(t, err)
		calls := b.srv.Calls()
		require.Len(t, calls, 1)
		require.Equal(t, k, calls[0].IdempotencyKey)
		require.Equal(t, []string{k}, calls[0].Header.Values("Idempotency-Key"))
		require.Equal(t, map[string]int{k: 1}, b.srv.Keys())
		require.Len(t, b.srv.CallsWithKey(k), 1)
	})

	t.Run("MissingKeyIsRefused", func(t *testing.T) {
		t.Parallel()
		b := setup(t, a)
		_, err := b.p.Complete(ctx, hello(""), nil)
		pe := requireError(t, a.name, err)
		require.False(t, pe.Retryable)
		require.False(t, pe.Unknown)
		require.Empty(t, b.srv.Calls())
	})

	for _, status := range []int{http.StatusInternalServerError, http.StatusServiceUnavailable, http.StatusTooManyRequests, http.StatusRequestTimeout} {
		t.Run(fmt.Sprintf("HTTP%dIsRetryableAndNotRetriedBySDK", status), func(t *testing.T) {
			t.Parallel()
			b := setup(t, a)
			b.srv.FailNext(nil, status, 10)
			k := key(t)
			_, err := b.p.Complete(ctx, hello(k), nil)
			pe := requireError(t, a.name, err)
			require.Equal(t, status, pe.Status)
			require.True(t, pe.Retryable)
			require.False(t, pe.Unknown)
			require.False(t, pe.Timeout)
			require.Equal(t, map[string]int{k: 1}, b.srv.Keys(), "the SDK must not retry")
		})
	}

	t.Run("RateLimitCarriesRetryAfter", func(t *testing.T) {
		t.Parallel()
		b := setup(t, a)
		b.srv.RateLimit(nil, 1, 2*time.Second)
		k := key(t)
		_, err := b.p.Complete(ctx, hello(k), nil)
		pe := requireError(t, a.name, err)
		require.Equal(t, http.StatusTooManyRequests, pe.Status)
		require.True(t, pe.Retryable)
		require.True(t, pe.RateLimited)
		require.Equal(t, 2*time.Second, pe.RetryAfter)
		require.Equal(t, map[string]int{k: 1}, b.srv.Keys(), "the SDK must not retry, whatever Retry-After says")
	})

	t.Run("Logprobs", func(t *testing.T) {
		t.Parallel()
		b := setup(t, a)
		b.srv.SetResponder(func(providertest.Call) providertest.Reply {
			return providertest.Reply{Text: "sure", Logprobs: []float64{-0.25, -0.5}}
		})
		req := hello(key(t))
		req.Logprobs = true
		resp, err := b.p.Complete(ctx, req, nil)
		if a.name == "anthropic" {
			pe := requireError(t, a.name, err)
			require.ErrorIs(t, pe, provider.ErrNoLogprobs)
			require.False(t, pe.Retryable)
			require.Empty(t, b.srv.Calls(), "nothing is sent")
			return
		}
		require.NoError(t, err)
		require.Equal(t, []float64{-0.25, -0.5}, resp.Logprobs)
		require.True(t, b.srv.Calls()[0].Logprobs)
	})

	for _, status := range []int{http.StatusBadRequest, http.StatusUnauthorized, http.StatusNotFound} {
		t.Run(fmt.Sprintf("HTTP%dIsPermanent", status), func(t *testing.T) {
			t.Parallel()
			b := setup(t, a)
			b.srv.SetResponder(func(providertest.Call) providertest.Reply { return providertest.Reply{Status: status} })
			k := key(t)
			_, err := b.p.Complete(ctx, hello(k), nil)
			pe := requireError(t, a.name, err)
			require.Equal(t, status, pe.Status)
			require.False(t, pe.Retryable)
			require.False(t, pe.Unknown)
			require.Equal(t, map[string]int{k: 1}, b.srv.Keys())
		})
	}

	t.Run("DropIsUnknown", func(t *testing.T) {
		t.Parallel()
		b := setup(t, a)
		k := key(t)
		b.srv.Drop(providertest.ByKey(k), 1)
		_, err := b.p.Complete(ctx, hello(k), nil)
		pe := requireError(t, a.name, err)
		require.Zero(t, pe.Status)
		require.True(t, pe.Retryable)
		require.True(t, pe.Unknown)
		require.False(t, pe.Timeout)
		require.Equal(t, map[string]int{k: 1}, b.srv.Keys())

		// The same key goes through once the fault is spent.
		resp, err := b.p.Complete(ctx, hello(k), nil)
		require.NoError(t, err)
		require.Equal(t, "echo: hello there", resp.Text)
	})

	t.Run("DropOnReusedConnectionIsNotResent", func(t *testing.T) {
		t.Parallel()
		b := setup(t, a)
		// Warm the connection pool so the next request reuses a connection:
		// net/http would resend a request with an Idempotency-Key on its own.
		_, err := b.p.Complete(ctx, hello(key(t)), nil)
		require.NoError(t, err)
		k := key(t)
		b.srv.Drop(providertest.ByKey(k), 1)
		_, err = b.p.Complete(ctx, hello(k), nil)
		pe := requireError(t, a.name, err)
		require.True(t, pe.Retryable)
		require.True(t, pe.Unknown)
		require.Equal(t, 1, b.srv.Keys()[k], "the request must reach the provider once")
	})

	t.Run("ContextDeadlineIsTimeoutAndUnknown", func(t *testing.T) {
		t.Parallel()
		b := setup(t, a)
		k := key(t)
		hold := b.srv.Hold(providertest.ByKey(k))
		defer hold.Release()
		cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		_, err := b.p.Complete(cctx, hello(k), nil)
		pe := requireError(t, a.name, err)
		require.True(t, pe.Timeout)
		require.True(t, pe.Retryable)
		require.True(t, pe.Unknown)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		c, err := hold.Wait(ctx)
		require.NoError(t, err)
		require.Equal(t, k, c.IdempotencyKey)
	})

	t.Run("ClientTimeoutIsTimeoutAndUnknown", func(t *testing.T) {
		t.Parallel()
		b := setup(t, a)
		hc := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone(), Timeout: 200 * time.Millisecond}
		t.Cleanup(hc.CloseIdleConnections)
		p := a.new(b.srv.URL(), hc)
		k := key(t)
		hold := b.srv.Hold(providertest.ByKey(k))
		defer hold.Release()
		_, err := p.Complete(ctx, hello(k), nil)
		pe := requireError(t, a.name, err)
		require.True(t, pe.Timeout)
		require.True(t, pe.Retryable)
		require.True(t, pe.Unknown)
	})

	t.Run("CancelIsNotRetryable", func(t *testing.T) {
		t.Parallel()
		b := setup(t, a)
		k := key(t)
		hold := b.srv.Hold(providertest.ByKey(k))
		defer hold.Release()
		cctx, cancel := context.WithCancel(ctx)
		go func() {
			_, _ = hold.Wait(ctx)
			cancel()
		}()
		_, err := b.p.Complete(cctx, hello(k), nil)
		require.ErrorIs(t, err, context.Canceled)
		pe := requireError(t, a.name, err)
		require.False(t, pe.Retryable)
		require.False(t, pe.Timeout)
	})

	t.Run("ConnectionRefusedIsRetryableNotUnknown", func(t *testing.T) {
		t.Parallel()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		root := "http://" + ln.Addr().String()
		require.NoError(t, ln.Close())
		p := a.new(root, &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()})
		_, err = p.Complete(ctx, hello(key(t)), nil)
		pe := requireError(t, a.name, err)
		require.Zero(t, pe.Status)
		require.True(t, pe.Retryable)
		require.False(t, pe.Unknown)
		require.False(t, pe.Timeout)
	})

	t.Run("HoldAndRelease", func(t *testing.T) {
		t.Parallel()
		b := setup(t, a)
		k := key(t)
		hold := b.srv.Hold(providertest.ByKey(k))
		type result struct {
			resp *provider.Response
			err  error
		}
		done := make(chan result, 1)
		go func() {
			resp, err := b.p.Complete(ctx, hello(k), nil)
			done <- result{resp, err}
		}()
		c, err := hold.Wait(ctx)
		require.NoError(t, err)
		require.Equal(t, k, c.IdempotencyKey)
		require.Equal(t, a.name, c.Provider)

		// Other keys are not held.
		_, err = b.p.Complete(ctx, hello(key(t)), nil)
		require.NoError(t, err)
		select {
		case r := <-done:
			t.Fatalf("held call returned before Release: %+v", r)
		default:
		}

		hold.Release()
		r := <-done
		require.NoError(t, r.err)
		require.Equal(t, "echo: hello there", r.resp.Text)
	})

	t.Run("Dedup", func(t *testing.T) {
		t.Parallel()
		b := setup(t, a)
		b.srv.Dedup(true)
		var n atomic.Int64
		b.srv.SetResponder(func(providertest.Call) providertest.Reply {
			return providertest.Reply{Text: fmt.Sprintf("answer %d", n.Add(1))}
		})
		k := key(t)
		first, err := b.p.Complete(ctx, hello(k), nil)
		require.NoError(t, err)
		again, err := b.p.Complete(ctx, hello(k), nil)
		require.NoError(t, err)
		require.Equal(t, first, again)
		require.Equal(t, "answer 1", again.Text)
		require.Equal(t, 2, b.srv.Keys()[k], "a deduplicated request is still recorded")

		other, err := b.p.Complete(ctx, hello(key(t)), nil)
		require.NoError(t, err)
		require.Equal(t, "answer 2", other.Text)
	})

	t.Run("DedupInProgressIsConflictAndUnknown", func(t *testing.T) {
		t.Parallel()
		b := setup(t, a)
		b.srv.Dedup(true)
		k := key(t)
		var first atomic.Bool
		hold := b.srv.Hold(func(c providertest.Call) bool { return c.IdempotencyKey == k && first.CompareAndSwap(false, true) })
		done := make(chan error, 1)
		go func() {
			_, err := b.p.Complete(ctx, hello(k), nil)
			done <- err
		}()
		_, err := hold.Wait(ctx)
		require.NoError(t, err)

		_, err = b.p.Complete(ctx, hello(k), nil)
		pe := requireError(t, a.name, err)
		require.Equal(t, http.StatusConflict, pe.Status)
		require.True(t, pe.Retryable)
		require.True(t, pe.Unknown, "a retry must reuse the key")

		hold.Release()
		require.NoError(t, <-done)
		resp, err := b.p.Complete(ctx, hello(k), nil)
		require.NoError(t, err)
		require.Equal(t, "echo: hello there", resp.Text)
	})

	t.Run("ErrorUnwrapsToSentinel", func(t *testing.T) {
		t.Parallel()
		b := setup(t, a)
		b.srv.FailNext(nil, http.StatusBadGateway, 1)
		_, err := b.p.Complete(ctx, hello(key(t)), nil)
		pe := requireError(t, a.name, err)
		require.True(t, pe.Unknown, "502: a gateway may have lost the answer")
		require.NotNil(t, errors.Unwrap(err))
	})

	exerciseStreaming(t, a)
}

// collect is a Sink that keeps what it is handed.
type collect struct {
	mu     sync.Mutex
	deltas []provider.Delta
}

func (c *collect) sink(d provider.Delta) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.deltas = append(c.deltas, d)
}

func (c *collect) got() []provider.Delta {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.deltas)
}

// exerciseStreaming: every call streams; the deltas make up the answer
// the call returns, and what else a call sends (output cap, response
// schema, images) reaches the provider in its own form.
func exerciseStreaming(t *testing.T, a adapter) {
	ctx := context.Background()

	t.Run("StreamsWordByWord", func(t *testing.T) {
		t.Parallel()
		b := setup(t, a)
		b.srv.SetResponder(func(providertest.Call) providertest.Reply {
			return providertest.Reply{Text: "one two  three\n"}
		})
		var c collect
		resp, err := b.p.Complete(ctx, hello(key(t)), c.sink)
		require.NoError(t, err)
		require.Equal(t, "one two  three\n", resp.Text)
		require.Equal(t, []provider.Delta{{Index: 0, Text: "one", Kind: provider.DeltaText},
			{Index: 1, Text: " two", Kind: provider.DeltaText}, {Index: 2, Text: "  three\n", Kind: provider.DeltaText}}, c.got())
		require.Equal(t, provider.Usage{InputTokens: 2, OutputTokens: 3}, resp.Usage)
		require.True(t, b.srv.Calls()[0].Stream)
	})

	t.Run("ReasoningStreamsFirst", func(t *testing.T) {
		t.Parallel()
		b := setup(t, a)
		b.srv.SetResponder(func(providertest.Call) providertest.Reply {
			return providertest.Reply{Reasoning: "think hard", Text: "done", ReasoningTokens: 2}
		})
		var c collect
		resp, err := b.p.Complete(ctx, hello(key(t)), c.sink)
		require.NoError(t, err)
		require.Equal(t, "done", resp.Text)
		require.Equal(t, []provider.Delta{{Index: 0, Text: "think", Kind: provider.DeltaReasoning},
			{Index: 1, Text: " hard", Kind: provider.DeltaReasoning}, {Index: 2, Text: "done", Kind: provider.DeltaText}}, c.got())
		require.Equal(t, int64(2), resp.Usage.ReasoningTokens)
		require.Equal(t, int64(3), resp.Usage.OutputTokens, "reasoning is output")
	})

	t.Run("CachedUsage", func(t *testing.T) {
		t.Parallel()
		b := setup(t, a)
		b.srv.SetResponder(func(providertest.Call) providertest.Reply {
			return providertest.Reply{Text: "ok", InputTokens: 1000, CacheReadTokens: 600, CacheWriteTokens: 300, OutputTokens: 50}
		})
		resp, err := b.p.Complete(ctx, hello(key(t)), nil)
		require.NoError(t, err)
		want := provider.Usage{InputTokens: 1000, CacheReadTokens: 600, CacheWriteTokens: 300, OutputTokens: 50}
		if a.name == "openai" {
			// Chat Completions reports cache reads only: cache writes are
			// not charged apart, and count as input.
			want.CacheWriteTokens = 0
		}
		require.Equal(t, want, resp.Usage)
	})

	t.Run("OutputCapAndSchemaAreSent", func(t *testing.T) {
		t.Parallel()
		b := setup(t, a)
		schema := json.RawMessage(`{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"],"additionalProperties":false}`)
		b.srv.SetResponder(func(providertest.Call) providertest.Reply { return providertest.Reply{Text: `{"n":3}`} })
		req := hello(key(t))
		req.MaxTokens, req.ResponseSchema = 77, schema
		resp, err := b.p.Complete(ctx, req, nil)
		require.NoError(t, err)
		require.Equal(t, `{"n":3}`, resp.Text)
		call := b.srv.Calls()[0]
		require.Equal(t, 77, call.MaxTokens)
		require.JSONEq(t, string(schema), string(call.ResponseSchema), "sent the provider's native way")
	})

	t.Run("Images", func(t *testing.T) {
		t.Parallel()
		b := setup(t, a)
		req := hello(key(t))
		png := []byte("\x89PNG\r\n\x1a\nfake")
		req.Messages[0].Images = []provider.Image{{URL: "https://example.com/cat.png"}, {MediaType: "image/png", Data: png}}
		_, err := b.p.Complete(ctx, req, nil)
		require.NoError(t, err)
		require.Equal(t, []provider.Message{{Role: provider.RoleUser, Content: "hello there", Images: []provider.Image{
			{URL: "https://example.com/cat.png"}, {MediaType: "image/png", Data: png}}}}, b.srv.Calls()[0].Messages)

		bad := hello(key(t))
		bad.Messages[0].Images = []provider.Image{{Blob: strings.Repeat("a", 64)}}
		_, err = b.p.Complete(ctx, bad, nil)
		pe := requireError(t, a.name, err)
		require.False(t, pe.Retryable, "an image with neither a URL nor bytes is refused before sending")
		require.Len(t, b.srv.Calls(), 1)
	})

	t.Run("HeldMidStream", func(t *testing.T) {
		t.Parallel()
		b := setup(t, a)
		b.srv.SetResponder(func(providertest.Call) providertest.Reply { return providertest.Reply{Text: "a b c d"} })
		k := key(t)
		hold := b.srv.HoldAfter(providertest.ByKey(k), 2)
		var c collect
		done := make(chan error, 1)
		go func() {
			_, err := b.p.Complete(ctx, hello(k), c.sink)
			done <- err
		}()
		_, err := hold.Wait(ctx)
		require.NoError(t, err)
		require.Eventually(t, func() bool { return len(c.got()) == 2 }, 5*time.Second, time.Millisecond,
			"the first two deltas arrive before the hold")
		hold.Release()
		require.NoError(t, <-done)
		require.Len(t, c.got(), 4)
	})

	t.Run("StreamCutIsUnknown", func(t *testing.T) {
		t.Parallel()
		b := setup(t, a)
		b.srv.SetResponder(func(providertest.Call) providertest.Reply { return providertest.Reply{Text: "a b c d"} })
		k := key(t)
		hold := b.srv.HoldAfter(providertest.ByKey(k), 1)
		done := make(chan error, 1)
		go func() {
			_, err := b.p.Complete(ctx, hello(k), nil)
			done <- err
		}()
		_, err := hold.Wait(ctx)
		require.NoError(t, err)
		b.srv.Close() // the connection is cut mid-stream
		pe := requireError(t, a.name, <-done)
		require.True(t, pe.Retryable)
		require.True(t, pe.Unknown, "the provider did some of the work: a retry keeps the key")
	})

	t.Run("DedupReplaysTheStream", func(t *testing.T) {
		t.Parallel()
		b := setup(t, a)
		b.srv.Dedup(true)
		var n atomic.Int64
		b.srv.SetResponder(func(providertest.Call) providertest.Reply {
			return providertest.Reply{Text: fmt.Sprintf("answer number %d", n.Add(1))}
		})
		k := key(t)
		var first, again collect
		_, err := b.p.Complete(ctx, hello(k), first.sink)
		require.NoError(t, err)
		_, err = b.p.Complete(ctx, hello(k), again.sink)
		require.NoError(t, err)
		require.Len(t, first.got(), 3)
		require.Equal(t, first.got(), again.got())
	})
}

// TestHugeAnswerIsCut: an answer bigger than MaxResponseBytes (here from a
// server that keeps streaming 64 KiB text deltas, 96 MiB in all) is not
// read past the cap, and fails the call permanently with
// ErrResponseTooLarge. An answer of half a MiB reads as usual.
func TestHugeAnswerIsCut(t *testing.T) {
	t.Parallel()
	for _, a := range adapters {
		t.Run(a.name, func(t *testing.T) {
			t.Parallel()
			var written atomic.Int64
			size := int64(3 * provider.MaxResponseBytes)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				n := size
				if r.Header.Get("X-Small") != "" {
					n = 1 << 19
				}
				head, delta, tail := answerFrames(a.name)
				_, _ = io.WriteString(w, head)
				chunk := strings.Repeat("a", 64<<10)
				for left := n; left > 0; left -= int64(len(chunk)) {
					k, err := io.WriteString(w, delta(chunk[:min(int64(len(chunk)), left)]))
					written.Add(int64(k))
					if err != nil {
						return
					}
				}
				_, _ = io.WriteString(w, tail)
			}))
			t.Cleanup(srv.Close)
			hc := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
			t.Cleanup(hc.CloseIdleConnections)
			root := srv.URL
			p := a.new(root, hc)
			req := provider.Request{Model: "m", IdempotencyKey: "huge", MaxTokens: 10,
				Messages: []provider.Message{{Role: provider.RoleUser, Content: "go"}}}
			_, err := p.Complete(context.Background(), req, nil)
			require.ErrorIs(t, err, provider.ErrResponseTooLarge)
			var pe *provider.Error
			require.ErrorAs(t, err, &pe)
			require.False(t, pe.Retryable, "the same request would get the same answer")
			require.Less(t, written.Load(), size, "the client stopped reading")

			small := &http.Client{Transport: headerTransport{"X-Small", "1"}}
			res, err := a.new(root, small).Complete(context.Background(), req, nil)
			require.NoError(t, err)
			require.Len(t, res.Text, 1<<19)
		})
	}
}

// answerFrames is a minimal streamed answer of the adapter's wire format:
// the events before its text, an event carrying a piece of text, and the
// events after it.
func answerFrames(name string) (head string, delta func(string) string, tail string) {
	if name == "openai" {
		chunk := `{"id":"x","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":%q}}]}`
		return "", func(text string) string { return "data: " + fmt.Sprintf(chunk, text) + "\n\n" },
			`data: {"id":"x","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}` + "\n\n" +
				`data: {"id":"x","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}` + "\n\n" +
				"data: [DONE]\n\n"
	}
	ev := func(body string) string {
		var typ struct{ Type string }
		_ = json.Unmarshal([]byte(body), &typ)
		return "event: " + typ.Type + "\ndata: " + body + "\n\n"
	}
	return ev(`{"type":"message_start","message":{"id":"x","type":"message","role":"assistant","model":"m","content":[],"stop_reason":null,"usage":{"input_tokens":1,"output_tokens":0}}}`) +
			ev(`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`),
		func(text string) string {
			return ev(fmt.Sprintf(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":%q}}`, text))
		},
		ev(`{"type":"content_block_stop","index":0}`) +
			ev(`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":1}}`) +
			ev(`{"type":"message_stop"}`)
}

// headerTransport adds one header to every request.
type headerTransport struct{ key, value string }

func (h headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set(h.key, h.value)
	return http.DefaultTransport.RoundTrip(r)
}
