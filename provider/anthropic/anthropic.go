// Package anthropic is PAL's provider for the Anthropic Messages API, built
// on the official Go SDK.
//
// Every call is sent once: the SDK's retries are off and the HTTP transport
// is kept from resending a request that was already written (see
// provider.Attempt). PAL journals its own retries. Each call carries the
// request's idempotency key in the Idempotency-Key header.
//
// The SDK speaks API version 2026-10-21, which refuses sampling parameters:
// Request.Temperature is not sent.
//
// Every call streams: text and thinking deltas reach the sink as they
// arrive, and the events are accumulated into the same answer a call
// without streaming gives. Request.ResponseSchema is sent as
// output_config.format (json_schema), the API's structured outputs.
package anthropic

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/anthropics/anthropic-sdk-go/v2/packages/param"

	"github.com/palrun/pal/provider"
)

// Name is the provider name used in workflows.
const Name = "anthropic"

// DefaultMaxTokens is sent when a request leaves MaxTokens at 0; the API
// requires a limit.
const DefaultMaxTokens = 1024

// Config configures a Provider.
type Config struct {
	// APIKey is the API key. Empty sends none.
	APIKey string
	// BaseURL is the API root without the /v1 path, e.g.
	// "https://api.anthropic.com". Empty means the SDK's default.
	BaseURL string
	// HTTPClient sends the requests; nil means http.DefaultClient.
	HTTPClient *http.Client
	// DevFake: the server is pal dev's fake provider, so a request's
	// Fake is sent (provider.FakeHeader, FakeStepHeader, FakeTurnHeader).
	// Otherwise it never is.
	DevFake bool
}

// Provider calls the Messages API. It is safe for concurrent use.
type Provider struct {
	messages anthropic.MessageService
	devFake  bool
}

var _ provider.Provider = (*Provider)(nil)

// New returns a Provider configured by cfg alone: it reads no environment
// variables, profiles or credential files.
func New(cfg Config) *Provider {
	hc := cfg.HTTPClient
	if hc == nil {
		hc = http.DefaultClient
	}
	opts := []option.RequestOption{
		option.WithoutEnvironmentDefaults(),
		option.WithHTTPClient(hc),
		option.WithMaxRetries(0),
	}
	if cfg.APIKey != "" {
		opts = append(opts, option.WithAPIKey(cfg.APIKey))
	}
	if cfg.BaseURL != "" {
		opts = append(opts, option.WithBaseURL(cfg.BaseURL))
	}
	client := anthropic.NewClient(opts...)
	return &Provider{messages: client.Messages, devFake: cfg.DevFake}
}

// FromEnv returns a Provider configured from ANTHROPIC_API_KEY and
// ANTHROPIC_BASE_URL (unset or empty means the SDK's default).
func FromEnv() *Provider {
	return New(Config{APIKey: os.Getenv("ANTHROPIC_API_KEY"), BaseURL: os.Getenv("ANTHROPIC_BASE_URL")})
}

// Name returns "anthropic".
func (p *Provider) Name() string { return Name }

// Complete sends req once, streaming, and hands the answer's text and
// thinking to sink as they arrive. Failures are *provider.Error values
// (see provider.Classify); a request that cannot be expressed (no
// idempotency key, an unknown role, a tool schema that is not a JSON
// object) fails with a permanent *provider.Error before anything is sent.
// A stream cut after it began (or an error event in it) is Retryable and
// Unknown: the provider did (some of) the work.
//
// System messages among req.Messages are added to the system prompt; tool
// messages become tool_result blocks of a user turn, and consecutive
// messages of one turn are merged, as the API requires. Usage.InputTokens
// counts cached input too (input + cache writes + cache reads), which
// CacheWriteTokens and CacheReadTokens name apart.
func (p *Provider) Complete(ctx context.Context, req provider.Request, sink provider.Sink) (*provider.Response, error) {
	if req.Logprobs {
		// The Messages API has no log probabilities.
		return nil, &provider.Error{Provider: Name, Err: provider.ErrNoLogprobs}
	}
	params, err := buildParams(req)
	if err != nil {
		return nil, &provider.Error{Provider: Name, Err: err}
	}
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
	stream := p.messages.NewStreaming(ctx, params, opts...)
	defer stream.Close()
	var out anthropic.Message
	n := 0
	for stream.Next() {
		ev := stream.Current()
		if err := out.Accumulate(ev); err != nil {
			return nil, attempt.Error(Name, 0, fmt.Errorf("streamed answer: %w", err))
		}
		if ev.Type == "content_block_delta" {
			switch ev.Delta.Type {
			case "text_delta":
				sink.Emit(&n, provider.DeltaText, ev.Delta.Text)
			case "thinking_delta":
				sink.Emit(&n, provider.DeltaReasoning, ev.Delta.Thinking)
			}
		}
	}
	if err := stream.Err(); err != nil {
		var apiErr *anthropic.Error
		var resp *http.Response
		if errors.As(err, &apiErr) {
			resp = apiErr.Response
			if resp == nil {
				resp = &http.Response{StatusCode: apiErr.StatusCode}
			}
		}
		return nil, attempt.ResponseError(Name, resp, err)
	}
	if out.ID == "" {
		// The provider answered, but no message began: another attempt
		// (with a new key) may do better.
		return nil, &provider.Error{Provider: Name, Status: http.StatusOK, Retryable: true,
			Err: errors.New("the streamed answer has no message_start")}
	}
	return toResponse(&out), nil
}

func buildParams(req provider.Request) (anthropic.MessageNewParams, error) {
	var params anthropic.MessageNewParams
	if req.IdempotencyKey == "" {
		return params, errors.New("request has no idempotency key")
	}
	params.Model = anthropic.Model(req.Model)
	params.MaxTokens = int64(req.MaxTokens)
	if params.MaxTokens <= 0 {
		params.MaxTokens = DefaultMaxTokens
	}
	system := []string{}
	if req.System != "" {
		system = append(system, req.System)
	}
	for i, m := range req.Messages {
		var user bool
		var blocks []anthropic.ContentBlockParamUnion
		switch m.Role {
		case provider.RoleSystem:
			system = append(system, m.Content)
			continue
		case provider.RoleUser:
			user = true
			if m.Content != "" || len(m.Images) == 0 {
				blocks = append(blocks, anthropic.NewTextBlock(m.Content))
			}
			for j, img := range m.Images {
				b, err := imageBlock(img)
				if err != nil {
					return params, fmt.Errorf("message %d: image %d: %w", i, j, err)
				}
				blocks = append(blocks, b)
			}
		case provider.RoleTool:
			if m.ToolCallID == "" {
				return params, fmt.Errorf("message %d: tool message has no tool_call_id", i)
			}
			user = true
			blocks = append(blocks, anthropic.NewToolResultBlock(m.ToolCallID, m.Content, false))
		case provider.RoleAssistant:
			if m.Content != "" {
				blocks = append(blocks, anthropic.NewTextBlock(m.Content))
			}
			for _, tc := range m.ToolCalls {
				input := tc.Arguments
				if len(input) == 0 {
					input = json.RawMessage("{}")
				}
				blocks = append(blocks, anthropic.NewToolUseBlock(tc.ID, input, tc.Name))
			}
			if len(blocks) == 0 {
				return params, fmt.Errorf("message %d: assistant message has neither content nor tool calls", i)
			}
		default:
			return params, fmt.Errorf("message %d: unknown role %q (want one of system, user, assistant, tool)", i, m.Role)
		}
		params.Messages = appendTurn(params.Messages, user, blocks)
	}
	if len(system) > 0 {
		params.System = []anthropic.TextBlockParam{{Text: strings.Join(system, "\n\n")}}
	}
	for _, t := range req.Tools {
		schema, err := inputSchema(t.Parameters)
		if err != nil {
			return params, fmt.Errorf("tool %q: %w", t.Name, err)
		}
		tool := anthropic.ToolParam{Name: t.Name, InputSchema: schema}
		if t.Description != "" {
			tool.Description = param.NewOpt(t.Description)
		}
		params.Tools = append(params.Tools, anthropic.ToolUnionParam{OfTool: &tool})
	}
	if len(req.ResponseSchema) > 0 {
		var schema map[string]any
		if err := json.Unmarshal(req.ResponseSchema, &schema); err != nil {
			return params, fmt.Errorf("response schema is not a JSON object: %w", err)
		}
		params.OutputConfig.Format = anthropic.JSONOutputFormatParam{Schema: schema}
	}
	return params, nil
}

// imageBlock is img as an image block: its URL, or its bytes in base64.
func imageBlock(img provider.Image) (anthropic.ContentBlockParamUnion, error) {
	switch {
	case img.URL != "":
		return anthropic.NewImageBlock(anthropic.URLImageSourceParam{URL: img.URL}), nil
	case len(img.Data) > 0:
		if img.MediaType == "" {
			return anthropic.ContentBlockParamUnion{}, errors.New("image bytes have no media type")
		}
		return anthropic.NewImageBlockBase64(img.MediaType, base64.StdEncoding.EncodeToString(img.Data)), nil
	}
	return anthropic.ContentBlockParamUnion{}, errors.New("image has neither a URL nor bytes")
}

// appendTurn adds blocks to the conversation, merging them into the last
// turn when it has the same role.
func appendTurn(msgs []anthropic.MessageParam, user bool, blocks []anthropic.ContentBlockParamUnion) []anthropic.MessageParam {
	if n := len(msgs); n > 0 {
		last := msgs[n-1]
		switch {
		case user && last.OfUser != nil:
			last.OfUser.Content = append(last.OfUser.Content, blocks...)
			return msgs
		case !user && last.OfAssistant != nil:
			last.OfAssistant.Content = append(last.OfAssistant.Content, blocks...)
			return msgs
		}
	}
	if user {
		return append(msgs, anthropic.NewUserMessage(blocks...))
	}
	return append(msgs, anthropic.NewAssistantMessage(blocks...))
}

// inputSchema turns a tool's JSON Schema into the SDK's input schema.
func inputSchema(raw json.RawMessage) (anthropic.ToolInputSchemaParam, error) {
	var schema anthropic.ToolInputSchemaParam
	if len(raw) == 0 {
		schema.Properties = map[string]any{}
		return schema, nil
	}
	var fields map[string]any
	if err := json.Unmarshal(raw, &fields); err != nil {
		return schema, fmt.Errorf("parameters are not a JSON object: %w", err)
	}
	if p, ok := fields["properties"]; ok {
		schema.Properties = p
		delete(fields, "properties")
	}
	if r, ok := fields["required"].([]any); ok {
		for _, name := range r {
			if s, ok := name.(string); ok {
				schema.Required = append(schema.Required, s)
			}
		}
		delete(fields, "required")
	}
	delete(fields, "type")
	if len(fields) > 0 {
		schema.ExtraFields = fields
	}
	return schema, nil
}

func toResponse(out *anthropic.Message) *provider.Response {
	resp := &provider.Response{
		ID:           out.ID,
		Model:        string(out.Model),
		FinishReason: string(out.StopReason),
		Usage: provider.Usage{
			InputTokens:      out.Usage.InputTokens + out.Usage.CacheCreationInputTokens + out.Usage.CacheReadInputTokens,
			OutputTokens:     out.Usage.OutputTokens,
			CacheReadTokens:  out.Usage.CacheReadInputTokens,
			CacheWriteTokens: out.Usage.CacheCreationInputTokens,
			ReasoningTokens:  out.Usage.OutputTokensDetails.ThinkingTokens,
		},
	}
	var text strings.Builder
	for _, block := range out.Content {
		switch block.Type {
		case "text":
			text.WriteString(block.Text)
		case "tool_use":
			args := append(json.RawMessage(nil), block.Input...)
			if len(args) == 0 {
				args = json.RawMessage("{}")
			}
			resp.ToolCalls = append(resp.ToolCalls, provider.ToolCall{ID: block.ID, Name: block.Name, Arguments: args})
		}
	}
	resp.Text = text.String()
	return resp
}
