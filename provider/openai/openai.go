// Package openai is PAL's provider for the OpenAI Chat Completions API (and
// any server that speaks it), built on the official Go SDK.
//
// Every call is sent once: the SDK's retries are off and the HTTP transport
// is kept from resending a request that was already written (see
// provider.Attempt). PAL journals its own retries. Each call carries the
// request's idempotency key in the Idempotency-Key header.
//
// Every call streams (stream: true, with the usage in the last chunk): the
// answer's text reaches the sink as it arrives, and the chunks are
// accumulated into the same answer a call without streaming gives.
// Reasoning text that a compatible server streams (reasoning_content or
// reasoning beside content) is handed over as reasoning deltas.
package openai

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/param"
	"github.com/openai/openai-go/v3/shared"

	"github.com/palrun/pal/provider"
)

// Name is the provider name used in workflows.
const Name = "openai"

// Config configures a Provider.
type Config struct {
	// APIKey is sent as the bearer token. Empty sends none.
	APIKey string
	// BaseURL is the API root, e.g. "https://api.openai.com/v1" or a
	// compatible server's "http://127.0.0.1:8080/v1". Empty means the SDK's
	// default.
	BaseURL string
	// HTTPClient sends the requests; nil means http.DefaultClient.
	HTTPClient *http.Client
	// DevFake: the server is pal dev's fake provider, so a request's
	// Fake is sent (provider.FakeHeader, FakeStepHeader, FakeTurnHeader).
	// Otherwise it never is.
	DevFake bool
}

// Provider calls the Chat Completions API. It is safe for concurrent use.
type Provider struct {
	completions openai.ChatCompletionService
	devFake     bool
}

var _ provider.Provider = (*Provider)(nil)

// New returns a Provider configured by cfg alone: it reads no environment
// variables.
func New(cfg Config) *Provider {
	hc := cfg.HTTPClient
	if hc == nil {
		hc = http.DefaultClient
	}
	opts := []option.RequestOption{
		option.WithEnvironmentProduction(),
		option.WithHTTPClient(hc),
		option.WithMaxRetries(0),
	}
	if cfg.APIKey != "" {
		opts = append(opts, option.WithAPIKey(cfg.APIKey))
	}
	if cfg.BaseURL != "" {
		opts = append(opts, option.WithBaseURL(cfg.BaseURL))
	}
	return &Provider{completions: openai.NewChatCompletionService(opts...), devFake: cfg.DevFake}
}

// FromEnv returns a Provider configured from OPENAI_API_KEY and
// OPENAI_BASE_URL (unset or empty means the SDK's default).
func FromEnv() *Provider {
	return New(Config{APIKey: os.Getenv("OPENAI_API_KEY"), BaseURL: os.Getenv("OPENAI_BASE_URL")})
}

// Name returns "openai".
func (p *Provider) Name() string { return Name }

// Complete sends req once, streaming, and hands the answer's text to sink
// as it arrives. Failures are *provider.Error values (see
// provider.Classify); a request that cannot be expressed (no idempotency
// key, an unknown role, a tool schema that is not a JSON object) fails with
// a permanent *provider.Error before anything is sent. A stream cut after
// it began is Retryable and Unknown: the provider did (some of) the work.
//
// MaxTokens is sent as max_completion_tokens, the field current models
// take; ResponseSchema as response_format json_schema, strict.
func (p *Provider) Complete(ctx context.Context, req provider.Request, sink provider.Sink) (*provider.Response, error) {
	params, err := buildParams(req)
	if err != nil {
		return nil, &provider.Error{Provider: Name, Err: err}
	}
	params.StreamOptions.IncludeUsage = param.NewOpt(true)
	var attempt provider.Attempt
	opts := []option.RequestOption{
		option.WithHeader("Idempotency-Key", req.IdempotencyKey),
		option.WithMiddleware(attempt.Middleware),
	}
	if p.devFake && req.Fake != nil {
		opts = append(opts, option.WithHeader(provider.FakeHeader, req.Fake.Script),
			option.WithHeader(provider.FakeStepHeader, req.Fake.Step),
			option.WithHeader(provider.FakeTurnHeader, strconv.Itoa(req.Fake.Turn)))
	}
	stream := p.completions.NewStreaming(ctx, params, opts...)
	defer stream.Close()
	var acc openai.ChatCompletionAccumulator
	n := 0
	for stream.Next() {
		chunk := stream.Current()
		if !acc.AddChunk(chunk) {
			return nil, attempt.Error(Name, 0, fmt.Errorf("answer %s: a streamed chunk does not follow the ones before it", chunk.ID))
		}
		for _, c := range chunk.Choices {
			if c.Index != 0 {
				continue
			}
			sink.Emit(&n, provider.DeltaReasoning, reasoningOf(c.Delta))
			sink.Emit(&n, provider.DeltaText, c.Delta.Content)
		}
	}
	if err := stream.Err(); err != nil {
		var apiErr *openai.Error
		var resp *http.Response
		if errors.As(err, &apiErr) {
			resp = apiErr.Response
			if resp == nil {
				resp = &http.Response{StatusCode: apiErr.StatusCode}
			}
		}
		return nil, attempt.ResponseError(Name, resp, err)
	}
	return toResponse(&acc.ChatCompletion)
}

// reasoningOf is the thinking text an OpenAI-compatible server streams
// beside the content (reasoning_content, or reasoning), "" when none.
func reasoningOf(d openai.ChatCompletionChunkChoiceDelta) string {
	for _, name := range []string{"reasoning_content", "reasoning"} {
		f, ok := d.JSON.ExtraFields[name]
		if !ok {
			continue
		}
		var s string
		if json.Unmarshal([]byte(f.Raw()), &s) == nil && s != "" {
			return s
		}
	}
	return ""
}

func buildParams(req provider.Request) (openai.ChatCompletionNewParams, error) {
	var params openai.ChatCompletionNewParams
	if req.IdempotencyKey == "" {
		return params, errors.New("request has no idempotency key")
	}
	params.Model = shared.ChatModel(req.Model)
	if req.System != "" {
		params.Messages = append(params.Messages, openai.SystemMessage(req.System))
	}
	for i, m := range req.Messages {
		msg, err := toMessage(m)
		if err != nil {
			return params, fmt.Errorf("message %d: %w", i, err)
		}
		params.Messages = append(params.Messages, msg)
	}
	for _, t := range req.Tools {
		fn := shared.FunctionDefinitionParam{Name: t.Name}
		if t.Description != "" {
			fn.Description = param.NewOpt(t.Description)
		}
		if len(t.Parameters) > 0 {
			if err := json.Unmarshal(t.Parameters, &fn.Parameters); err != nil {
				return params, fmt.Errorf("tool %q: parameters are not a JSON object: %w", t.Name, err)
			}
		}
		params.Tools = append(params.Tools, openai.ChatCompletionFunctionTool(fn))
	}
	if req.MaxTokens > 0 {
		params.MaxCompletionTokens = param.NewOpt(int64(req.MaxTokens))
	}
	if req.Temperature != nil {
		params.Temperature = param.NewOpt(*req.Temperature)
	}
	if req.Logprobs {
		params.Logprobs = param.NewOpt(true)
	}
	if len(req.ResponseSchema) > 0 {
		var schema map[string]any
		if err := json.Unmarshal(req.ResponseSchema, &schema); err != nil {
			return params, fmt.Errorf("response schema is not a JSON object: %w", err)
		}
		params.ResponseFormat.OfJSONSchema = &shared.ResponseFormatJSONSchemaParam{
			JSONSchema: shared.ResponseFormatJSONSchemaJSONSchemaParam{
				Name: "response", Strict: param.NewOpt(true), Schema: schema}}
	}
	return params, nil
}

func toMessage(m provider.Message) (openai.ChatCompletionMessageParamUnion, error) {
	switch m.Role {
	case provider.RoleSystem:
		return openai.SystemMessage(m.Content), nil
	case provider.RoleUser:
		if len(m.Images) == 0 {
			return openai.UserMessage(m.Content), nil
		}
		parts := []openai.ChatCompletionContentPartUnionParam{}
		if m.Content != "" {
			parts = append(parts, openai.TextContentPart(m.Content))
		}
		for i, img := range m.Images {
			url, err := imageURL(img)
			if err != nil {
				return openai.ChatCompletionMessageParamUnion{}, fmt.Errorf("image %d: %w", i, err)
			}
			parts = append(parts, openai.ImageContentPart(openai.ChatCompletionContentPartImageImageURLParam{URL: url}))
		}
		return openai.UserMessage(parts), nil
	case provider.RoleTool:
		if m.ToolCallID == "" {
			return openai.ChatCompletionMessageParamUnion{}, errors.New("tool message has no tool_call_id")
		}
		return openai.ToolMessage(m.Content, m.ToolCallID), nil
	case provider.RoleAssistant:
		var a openai.ChatCompletionAssistantMessageParam
		if m.Content != "" || len(m.ToolCalls) == 0 {
			a.Content.OfString = param.NewOpt(m.Content)
		}
		for _, tc := range m.ToolCalls {
			args := string(tc.Arguments)
			if args == "" {
				args = "{}"
			}
			a.ToolCalls = append(a.ToolCalls, openai.ChatCompletionMessageToolCallUnionParam{
				OfFunction: &openai.ChatCompletionMessageFunctionToolCallParam{
					ID: tc.ID,
					Function: openai.ChatCompletionMessageFunctionToolCallFunctionParam{
						Name:      tc.Name,
						Arguments: args,
					},
				},
			})
		}
		return openai.ChatCompletionMessageParamUnion{OfAssistant: &a}, nil
	}
	return openai.ChatCompletionMessageParamUnion{}, fmt.Errorf("unknown role %q (want one of system, user, assistant, tool)", m.Role)
}

// imageURL is img as the API takes it: its URL, or its bytes as a data:
// URL.
func imageURL(img provider.Image) (string, error) {
	switch {
	case img.URL != "":
		return img.URL, nil
	case len(img.Data) > 0:
		if img.MediaType == "" {
			return "", errors.New("image bytes have no media type")
		}
		return "data:" + img.MediaType + ";base64," + base64.StdEncoding.EncodeToString(img.Data), nil
	}
	return "", errors.New("image has neither a URL nor bytes")
}

func toResponse(out *openai.ChatCompletion) (*provider.Response, error) {
	if len(out.Choices) == 0 {
		// The provider answered, so the outcome is known; another attempt
		// (with a new key) may do better.
		return nil, &provider.Error{Provider: Name, Status: http.StatusOK, Retryable: true,
			Err: fmt.Errorf("answer %s has no choices", out.ID)}
	}
	choice := out.Choices[0]
	resp := &provider.Response{
		ID:           out.ID,
		Model:        out.Model,
		Text:         choice.Message.Content,
		FinishReason: choice.FinishReason,
		Usage: provider.Usage{
			InputTokens:     out.Usage.PromptTokens,
			OutputTokens:    out.Usage.CompletionTokens,
			CacheReadTokens: out.Usage.PromptTokensDetails.CachedTokens,
			ReasoningTokens: out.Usage.CompletionTokensDetails.ReasoningTokens,
		},
	}
	for _, lp := range choice.Logprobs.Content {
		resp.Logprobs = append(resp.Logprobs, lp.Logprob)
	}
	for _, tc := range choice.Message.ToolCalls {
		if tc.Type != "function" {
			continue
		}
		resp.ToolCalls = append(resp.ToolCalls, provider.ToolCall{
			ID:        tc.ID,
			Name:      tc.Function.Name,
			Arguments: rawArguments(tc.Function.Arguments),
		})
	}
	return resp, nil
}

// rawArguments returns a model's tool arguments as JSON. Models can emit
// text that is not JSON; it is kept as a JSON string so that the response
// can always be journaled.
func rawArguments(s string) json.RawMessage {
	switch {
	case s == "":
		return json.RawMessage("{}")
	case json.Valid([]byte(s)):
		return json.RawMessage(s)
	}
	b, _ := json.Marshal(s)
	return b
}
