// Package provider is PAL's seam to LLM APIs. A Provider sends one model
// call; the worker journals it. Implementations live in provider/openai and
// provider/anthropic (official SDKs, SDK retries off, Idempotency-Key header
// on every call, answers always streamed); provider/providertest is an HTTP
// fake that speaks both wire formats, streamed and not, and records every
// request with its idempotency key.
//
// A call streams: the answer's text reaches the caller's Sink as it is
// written (Delta), and Complete returns the whole answer, the same Response
// a call without streaming would give. The deltas are for watchers; the
// journal keeps only the whole answer.
//
// Invariants: a Provider sends each Complete call at most once and never
// retries (retries are PAL's, journaled by the worker, never the SDK's), and
// every request carries Request.IdempotencyKey as its Idempotency-Key
// header. A failed call returns an *Error that says whether it may be
// retried and whether its outcome is unknown (the request may have reached
// the provider), in which case the retry must reuse the same idempotency
// key (docs/architecture.md §2 guarantee 5, §7.6).
package provider

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/palrun/pal/internal/registry"
)

// Message roles.
const (
	RoleSystem    = "system"
	RoleUser      = "user"
	RoleAssistant = "assistant"
	RoleTool      = "tool"
)

// Message is one chat message. An assistant message may carry ToolCalls; a
// tool message answers the call named by ToolCallID. A user message may
// carry Images, sent after its text.
type Message struct {
	Role       string     `json:"role"`
	Content    string     `json:"content,omitempty"`
	Images     []Image    `json:"images,omitempty"`
	ToolCalls  []ToolCall `json:"tool_calls,omitempty"`
	ToolCallID string     `json:"tool_call_id,omitempty"`
}

// Image is an image part of a user message: a URL the provider fetches, or
// bytes. In a step's journaled input an image is a URL or Blob, the sha256
// of a PAL_BLOBS value the run holds (docs/architecture.md §6.4); the
// worker reads a blob's bytes into Data before the call, and a provider
// sends URL or Data in its own form.
type Image struct {
	URL string `json:"url,omitempty"`
	// Blob is the hex sha256 of a big value of the run: a JSON string
	// holding the image's bytes in base64.
	Blob string `json:"blob,omitempty"`
	// MediaType is the bytes' type: image/png, image/jpeg, image/gif or
	// image/webp. Required with Blob and Data.
	MediaType string `json:"media_type,omitempty"`
	// Data are the image's bytes (base64 in JSON).
	Data []byte `json:"data,omitempty"`
}

// ImageMediaTypes are the media types both providers take for image bytes.
var ImageMediaTypes = []string{"image/png", "image/jpeg", "image/gif", "image/webp"}

// MaxImageBytes bounds the bytes of one image a call sends: the providers
// refuse bigger ones (Anthropic 5 MiB, OpenAI 20 MiB).
const MaxImageBytes = 5 << 20

// Tool describes a function the model may call. Parameters is a JSON Schema
// object.
type Tool struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
}

// ToolCall is a model's request to call a tool.
type ToolCall struct {
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
}

// Request is one model call.
type Request struct {
	Model       string    `json:"model"`
	System      string    `json:"system,omitempty"`
	Messages    []Message `json:"messages"`
	MaxTokens   int       `json:"max_tokens,omitempty"`
	Temperature *float64  `json:"temperature,omitempty"`
	Tools       []Tool    `json:"tools,omitempty"`
	// Logprobs asks for the answer's token log probabilities. Only
	// providers that can give them take it (OpenAI); the others fail the
	// call with a permanent error rather than answer without them.
	Logprobs bool `json:"logprobs,omitempty"`
	// ResponseSchema, when set, is a JSON Schema the answer's text must
	// match; it is sent the way the provider supports natively (OpenAI
	// response_format json_schema strict, Anthropic output_config.format).
	// The provider does not check the answer: the caller does.
	ResponseSchema json.RawMessage `json:"response_schema,omitempty"`
	// IdempotencyKey is sent as the Idempotency-Key header. Required.
	IdempotencyKey string `json:"idempotency_key"`
	// Fake, when set, scripts pal dev's fake provider: a provider
	// configured for it (DevFake in provider/openai's and
	// provider/anthropic's Config) sends it as the FakeHeader,
	// FakeStepHeader and FakeTurnHeader headers; any other ignores it.
	// Never journaled.
	Fake *Fake `json:"-"`
}

// Headers that carry a node's fake block to pal dev's fake provider
// (provider/providertest, docs/architecture.md §9.7).
const (
	// FakeHeader holds the block (workflow.Fake) as compact JSON.
	FakeHeader = "X-Pal-Fake"
	// FakeStepHeader names the step the block's failures are counted
	// under: "<run id>/<step id>".
	FakeStepHeader = "X-Pal-Fake-Step"
	// FakeTurnHeader is the turn of the block that answers: an agent
	// turn's index, 0 for an ai-step.
	FakeTurnHeader = "X-Pal-Fake-Turn"
)

// Fake is what a request tells pal dev's fake provider: the node's fake
// block, and the step whose requests its failures count.
type Fake struct {
	// Script is the block as compact JSON (workflow.Fake.Header).
	Script string
	// Step is "<run id>/<step id>": the node's step (an agent's, for each
	// of its turns).
	Step string
	// Turn is the index of the turn that answers: the agent turn's, 0 for
	// an ai-step (whatever assistant messages its prompt or thread holds).
	Turn int
}

// Usage is the token accounting the provider reported. InputTokens counts
// the whole input, cached or not: CacheReadTokens (input read from the
// provider's prompt cache) and CacheWriteTokens (input written to it) are
// parts of it, priced at their own rates. ReasoningTokens (thinking) are
// part of OutputTokens.
type Usage struct {
	InputTokens      int64 `json:"input_tokens"`
	OutputTokens     int64 `json:"output_tokens"`
	CacheReadTokens  int64 `json:"cache_read_tokens,omitempty"`
	CacheWriteTokens int64 `json:"cache_write_tokens,omitempty"`
	ReasoningTokens  int64 `json:"reasoning_tokens,omitempty"`
}

// Delta kinds.
const (
	// DeltaText is answer text.
	DeltaText = "text"
	// DeltaReasoning is thinking text, where the provider streams it.
	DeltaReasoning = "reasoning"
)

// Delta is a piece of an answer as it streams. Index numbers a call's
// deltas from 0, in order; the whole answer's text is the concatenation of
// its text deltas.
type Delta struct {
	Index int    `json:"index"`
	Text  string `json:"text"`
	Kind  string `json:"kind,omitempty"`
}

// Sink receives a call's deltas as they arrive, on the calling goroutine:
// it must not block for long, as the stream waits for it. A nil Sink drops
// them.
type Sink func(Delta)

// Emit hands text of kind to s as the delta after n (n counts the deltas
// emitted so far and is advanced); empty text is not a delta.
func (s Sink) Emit(n *int, kind, text string) {
	if s == nil || text == "" {
		return
	}
	s(Delta{Index: *n, Text: text, Kind: kind})
	*n++
}

// Response is a model's answer.
type Response struct {
	ID           string     `json:"id,omitempty"`
	Model        string     `json:"model"`
	Text         string     `json:"text"`
	ToolCalls    []ToolCall `json:"tool_calls,omitempty"`
	FinishReason string     `json:"finish_reason,omitempty"`
	Usage        Usage      `json:"usage"`
	// Logprobs are the log probabilities of the answer's tokens, when the
	// request asked for them.
	Logprobs []float64 `json:"logprobs,omitempty"`
}

// ErrNoLogprobs is returned (wrapped, permanent) by a provider asked for
// log probabilities it cannot give.
var ErrNoLogprobs = errors.New("this provider does not return token log probabilities")

// Provider sends model calls. Complete returns an *Error for failures the
// caller can classify.
type Provider interface {
	// Name is the provider name used in workflows ("openai", "anthropic").
	Name() string
	// Complete sends req once (no retries), hands the answer's text to
	// sink as it streams (nil: nowhere), and returns the whole answer. A
	// call that fails after deltas were handed over returns an *Error like
	// any other: the deltas are not an answer.
	Complete(ctx context.Context, req Request, sink Sink) (*Response, error)
}

// Error is a failed model call.
type Error struct {
	Provider string
	// Status is the HTTP status, 0 when no response arrived.
	Status int
	// Retryable reports that trying again may succeed (429, 5xx, timeouts,
	// connection failures).
	Retryable bool
	// Unknown reports that the request may have reached the provider (a
	// timeout or a connection cut after sending): a retry must reuse the
	// same idempotency key.
	Unknown bool
	// Timeout reports that the call ran out of time.
	Timeout bool
	// RateLimited reports a refusal to do the work now (HTTP 429, 503,
	// 529): a retry reuses the idempotency key, as nothing was done.
	RateLimited bool
	// RetryAfter is how long the provider asked the caller to wait (its
	// Retry-After or rate-limit reset headers; see RetryAfter), 0 when it
	// did not say.
	RetryAfter time.Duration
	Err        error
}

func (e *Error) Error() string {
	if e.Status != 0 {
		return fmt.Sprintf("%s: HTTP %d: %v", e.Provider, e.Status, e.Err)
	}
	return fmt.Sprintf("%s: %v", e.Provider, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// ErrUnknownProvider is returned by Registry.Get for a name nobody registered.
var ErrUnknownProvider = errors.New("unknown provider")

// Registry maps provider names to providers. Get returns an error
// wrapping ErrUnknownProvider for a name nobody registered.
type Registry = registry.Registry[Provider, providers]

// providers is the Kind of a Registry.
type providers struct{}

func (providers) Unknown() error { return ErrUnknownProvider }
