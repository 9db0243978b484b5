package providertest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/palrun/pal/provider"
)

// The OpenAI Chat Completions wire format: POST /v1/chat/completions,
// answered as one JSON object, or with "stream": true as server-sent
// events of chat.completion.chunk objects ending in "data: [DONE]".

type openAIWire struct{}

type oaRequest struct {
	Model    string      `json:"model"`
	Messages []oaMessage `json:"messages"`
	Tools    []struct {
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	} `json:"tools"`
	Stream        bool `json:"stream"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	Logprobs            bool `json:"logprobs"`
	MaxCompletionTokens int  `json:"max_completion_tokens"`
	MaxTokens           int  `json:"max_tokens"`
	ResponseFormat      struct {
		Type       string `json:"type"`
		JSONSchema struct {
			Strict bool            `json:"strict"`
			Schema json.RawMessage `json:"schema"`
		} `json:"json_schema"`
	} `json:"response_format"`
}

type oaMessage struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	ToolCallID string          `json:"tool_call_id"`
	ToolCalls  []oaToolCall    `json:"tool_calls"`
}

type oaToolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

func (openAIWire) name() string { return OpenAI }

func (openAIWire) parse(c *Call) error {
	var req oaRequest
	if err := json.Unmarshal(c.Body, &req); err != nil {
		return fmt.Errorf("body is not a chat completion request: %w", err)
	}
	c.Model = req.Model
	var system []string
	for _, m := range req.Messages {
		text, images, err := oaContent(m.Content)
		if err != nil {
			return err
		}
		switch m.Role {
		case "system", "developer":
			system = append(system, text)
			continue
		}
		msg := provider.Message{Role: m.Role, Content: text, Images: images, ToolCallID: m.ToolCallID}
		for _, tc := range m.ToolCalls {
			msg.ToolCalls = append(msg.ToolCalls, provider.ToolCall{
				ID: tc.ID, Name: tc.Function.Name, Arguments: rawJSON(tc.Function.Arguments),
			})
		}
		c.Messages = append(c.Messages, msg)
	}
	c.System = strings.Join(system, "\n\n")
	for _, t := range req.Tools {
		c.Tools = append(c.Tools, t.Function.Name)
	}
	c.Logprobs = req.Logprobs
	c.Stream, c.streamUsage = req.Stream, req.StreamOptions.IncludeUsage
	c.MaxTokens = max(req.MaxCompletionTokens, req.MaxTokens)
	if req.ResponseFormat.Type == "json_schema" {
		if !req.ResponseFormat.JSONSchema.Strict {
			return fmt.Errorf("response_format json_schema without strict: true")
		}
		c.ResponseSchema = req.ResponseFormat.JSONSchema.Schema
	}
	return nil
}

// oaContent returns a message's content: a string, null, or an array of
// parts whose text parts are joined and whose image parts are images.
func oaContent(raw json.RawMessage) (string, []provider.Image, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil, nil
	}
	var parts []struct {
		Type     string `json:"type"`
		Text     string `json:"text"`
		ImageURL struct {
			URL string `json:"url"`
		} `json:"image_url"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", nil, fmt.Errorf("message content is neither a string nor an array of parts: %w", err)
	}
	var b strings.Builder
	var images []provider.Image
	for _, p := range parts {
		switch p.Type {
		case "text":
			b.WriteString(p.Text)
		case "image_url":
			img, isData, err := dataURL(p.ImageURL.URL)
			if err != nil {
				return "", nil, err
			}
			if !isData {
				img = provider.Image{URL: p.ImageURL.URL}
			}
			images = append(images, img)
		}
	}
	return b.String(), images, nil
}

// oaUsage is the usage object of an answer.
func oaUsage(r Reply) map[string]any {
	u := map[string]any{
		"prompt_tokens":     r.InputTokens,
		"completion_tokens": r.OutputTokens,
		"total_tokens":      r.InputTokens + r.OutputTokens,
	}
	if r.CacheReadTokens > 0 {
		u["prompt_tokens_details"] = map[string]any{"cached_tokens": r.CacheReadTokens}
	}
	if r.ReasoningTokens > 0 {
		u["completion_tokens_details"] = map[string]any{"reasoning_tokens": r.ReasoningTokens}
	}
	return u
}

// oaFinish is the finish reason of an answer.
func oaFinish(r Reply) string {
	if len(r.ToolCalls) > 0 {
		return "tool_calls"
	}
	return "stop"
}

// oaLogprobs is the logprobs object of an answer: one token per scripted
// log probability, as the API gives them, when the call asked.
func oaLogprobs(c Call, r Reply) any {
	if !c.Logprobs || len(r.Logprobs) == 0 {
		return nil
	}
	content := make([]any, len(r.Logprobs))
	for i, lp := range r.Logprobs {
		content[i] = map[string]any{"token": fmt.Sprintf("t%d", i), "logprob": lp, "bytes": []int{}, "top_logprobs": []any{}}
	}
	return map[string]any{"content": content, "refusal": []any{}}
}

type oaFunction struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

type oaCall struct {
	Index    *int       `json:"index,omitempty"`
	ID       string     `json:"id"`
	Type     string     `json:"type"`
	Function oaFunction `json:"function"`
}

func (openAIWire) reply(c Call, r Reply, id int) []byte {
	msg := struct {
		Role      string   `json:"role"`
		Content   *string  `json:"content"`
		Refusal   *string  `json:"refusal"`
		ToolCalls []oaCall `json:"tool_calls,omitempty"`
	}{Role: "assistant"}
	if r.Text != "" || len(r.ToolCalls) == 0 {
		msg.Content = &r.Text
	}
	for i, tc := range r.ToolCalls {
		msg.ToolCalls = append(msg.ToolCalls, oaCall{
			ID:       toolCallID(tc, "call", id, i),
			Type:     "function",
			Function: oaFunction{Name: tc.Name, Arguments: string(argumentsObject(tc.Arguments))},
		})
	}
	return mustJSON(map[string]any{
		"id":      fmt.Sprintf("chatcmpl-fake%d", id),
		"object":  "chat.completion",
		"created": c.At.Unix(),
		"model":   c.Model,
		"choices": []any{map[string]any{
			"index":         0,
			"message":       msg,
			"finish_reason": oaFinish(r),
			"logprobs":      oaLogprobs(c, r),
		}},
		"usage": oaUsage(r),
	})
}

func (openAIWire) frames(c Call, r Reply, id int) []frame {
	chunk := func(choices []any, usage any) []byte {
		body := map[string]any{
			"id":      fmt.Sprintf("chatcmpl-fake%d", id),
			"object":  "chat.completion.chunk",
			"created": c.At.Unix(),
			"model":   c.Model,
			"choices": choices,
		}
		if usage != nil {
			body["usage"] = usage
		}
		return mustJSON(body)
	}
	choice := func(delta map[string]any, finish any, logprobs any) []any {
		return []any{map[string]any{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}}
	}
	out := []frame{{data: chunk(choice(map[string]any{"role": "assistant", "content": ""}, nil, nil), nil)}}
	for _, w := range pieces(r.Reasoning) {
		out = append(out, frame{data: chunk(choice(map[string]any{"reasoning_content": w}, nil, nil), nil), delta: true})
	}
	for _, w := range pieces(r.Text) {
		out = append(out, frame{data: chunk(choice(map[string]any{"content": w}, nil, nil), nil), delta: true})
	}
	for i, tc := range r.ToolCalls {
		out = append(out, frame{data: chunk(choice(map[string]any{"tool_calls": []oaCall{{
			Index: &i, ID: toolCallID(tc, "call", id, i), Type: "function",
			Function: oaFunction{Name: tc.Name, Arguments: string(argumentsObject(tc.Arguments))},
		}}}, nil, nil), nil)})
	}
	out = append(out, frame{data: chunk(choice(map[string]any{}, oaFinish(r), oaLogprobs(c, r)), nil)})
	if c.streamUsage {
		out = append(out, frame{data: chunk([]any{}, oaUsage(r))})
	}
	return append(out, frame{data: []byte("[DONE]")})
}

func (openAIWire) fail(status int, msg string) []byte {
	typ := "invalid_request_error"
	switch {
	case status == http.StatusUnauthorized:
		typ = "authentication_error"
	case status == http.StatusTooManyRequests:
		typ = "rate_limit_exceeded"
	case status >= 500:
		typ = "server_error"
	}
	return mustJSON(map[string]any{"error": map[string]any{
		"message": msg, "type": typ, "param": nil, "code": nil,
	}})
}
