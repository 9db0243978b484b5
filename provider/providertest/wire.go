package providertest

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/palrun/pal/provider"
)

var errStreaming = errors.New("streaming is not supported (send stream: false)")

// toolCallID returns tc's ID, or a made-up one that is unique in the server.
func toolCallID(tc provider.ToolCall, prefix string, id, i int) string {
	if tc.ID != "" {
		return tc.ID
	}
	return fmt.Sprintf("%s_fake%d_%d", prefix, id, i)
}

// argumentsObject returns tool arguments as a JSON value, {} when empty or
// not JSON.
func argumentsObject(raw json.RawMessage) json.RawMessage {
	if len(raw) == 0 || !json.Valid(raw) {
		return json.RawMessage("{}")
	}
	return raw
}

// rawJSON returns s if it is JSON, else s as a JSON string.
func rawJSON(s string) json.RawMessage {
	if json.Valid([]byte(s)) {
		return json.RawMessage(s)
	}
	return mustJSON(s)
}

// --- OpenAI Chat Completions ---

type openAIWire struct{}

type oaRequest struct {
	Model    string      `json:"model"`
	Messages []oaMessage `json:"messages"`
	Tools    []struct {
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	} `json:"tools"`
	Stream   bool `json:"stream"`
	Logprobs bool `json:"logprobs"`
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
		text, err := oaText(m.Content)
		if err != nil {
			return err
		}
		switch m.Role {
		case "system", "developer":
			system = append(system, text)
			continue
		}
		msg := provider.Message{Role: m.Role, Content: text, ToolCallID: m.ToolCallID}
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
	if req.Stream {
		return errStreaming
	}
	return nil
}

// oaText returns a message's content: a string, null, or an array of parts
// whose text parts are joined.
func oaText(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", fmt.Errorf("message content is neither a string nor an array of parts: %w", err)
	}
	var b strings.Builder
	for _, p := range parts {
		if p.Type == "text" {
			b.WriteString(p.Text)
		}
	}
	return b.String(), nil
}

func (openAIWire) reply(c Call, r Reply, id int) []byte {
	type function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	}
	type toolCall struct {
		ID       string   `json:"id"`
		Type     string   `json:"type"`
		Function function `json:"function"`
	}
	msg := struct {
		Role      string     `json:"role"`
		Content   *string    `json:"content"`
		Refusal   *string    `json:"refusal"`
		ToolCalls []toolCall `json:"tool_calls,omitempty"`
	}{Role: "assistant"}
	if r.Text != "" || len(r.ToolCalls) == 0 {
		msg.Content = &r.Text
	}
	finish := "stop"
	for i, tc := range r.ToolCalls {
		finish = "tool_calls"
		msg.ToolCalls = append(msg.ToolCalls, toolCall{
			ID:       toolCallID(tc, "call", id, i),
			Type:     "function",
			Function: function{Name: tc.Name, Arguments: string(argumentsObject(tc.Arguments))},
		})
	}
	var logprobs any
	if c.Logprobs && len(r.Logprobs) > 0 {
		// One token per scripted log probability, as the API gives them.
		content := make([]any, len(r.Logprobs))
		for i, lp := range r.Logprobs {
			content[i] = map[string]any{"token": fmt.Sprintf("t%d", i), "logprob": lp, "bytes": []int{}, "top_logprobs": []any{}}
		}
		logprobs = map[string]any{"content": content, "refusal": []any{}}
	}
	body := map[string]any{
		"id":      fmt.Sprintf("chatcmpl-fake%d", id),
		"object":  "chat.completion",
		"created": c.At.Unix(),
		"model":   c.Model,
		"choices": []any{map[string]any{
			"index":         0,
			"message":       msg,
			"finish_reason": finish,
			"logprobs":      logprobs,
		}},
		"usage": map[string]any{
			"prompt_tokens":     r.InputTokens,
			"completion_tokens": r.OutputTokens,
			"total_tokens":      r.InputTokens + r.OutputTokens,
		},
	}
	return mustJSON(body)
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

// --- Anthropic Messages ---

type anthropicWire struct{}

type anRequest struct {
	Model    string          `json:"model"`
	System   json.RawMessage `json:"system"`
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	Tools []struct {
		Name string `json:"name"`
	} `json:"tools"`
	Stream bool `json:"stream"`
}

type anBlock struct {
	Type      string          `json:"type"`
	Text      string          `json:"text"`
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
}

func (anthropicWire) name() string { return Anthropic }

func (anthropicWire) parse(c *Call) error {
	var req anRequest
	if err := json.Unmarshal(c.Body, &req); err != nil {
		return fmt.Errorf("body is not a messages request: %w", err)
	}
	c.Model = req.Model
	system, err := anText(req.System)
	if err != nil {
		return fmt.Errorf("system: %w", err)
	}
	systems := []string{}
	if system != "" {
		systems = append(systems, system)
	}
	for _, m := range req.Messages {
		blocks, err := anBlocks(m.Content)
		if err != nil {
			return err
		}
		var text strings.Builder
		var calls []provider.ToolCall
		for _, b := range blocks {
			switch b.Type {
			case "text":
				text.WriteString(b.Text)
			case "tool_use":
				calls = append(calls, provider.ToolCall{ID: b.ID, Name: b.Name, Arguments: b.Input})
			case "tool_result":
				result, err := anText(b.Content)
				if err != nil {
					return fmt.Errorf("tool_result: %w", err)
				}
				c.Messages = append(c.Messages, provider.Message{Role: provider.RoleTool, Content: result, ToolCallID: b.ToolUseID})
			}
		}
		switch {
		case m.Role == "system":
			systems = append(systems, text.String())
		case m.Role == "assistant":
			c.Messages = append(c.Messages, provider.Message{Role: provider.RoleAssistant, Content: text.String(), ToolCalls: calls})
		case text.Len() > 0 || len(blocks) == 0:
			c.Messages = append(c.Messages, provider.Message{Role: m.Role, Content: text.String()})
		}
	}
	c.System = strings.Join(systems, "\n\n")
	for _, t := range req.Tools {
		c.Tools = append(c.Tools, t.Name)
	}
	if req.Stream {
		return errStreaming
	}
	return nil
}

// anBlocks returns a message's content blocks; a string is one text block.
func anBlocks(raw json.RawMessage) ([]anBlock, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return []anBlock{{Type: "text", Text: s}}, nil
	}
	var blocks []anBlock
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return nil, fmt.Errorf("message content is neither a string nor an array of blocks: %w", err)
	}
	return blocks, nil
}

// anText returns the text of a string or of an array of blocks.
func anText(raw json.RawMessage) (string, error) {
	blocks, err := anBlocks(raw)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, blk := range blocks {
		if blk.Type == "text" {
			b.WriteString(blk.Text)
		}
	}
	return b.String(), nil
}

func (anthropicWire) reply(c Call, r Reply, id int) []byte {
	content := []any{}
	if r.Text != "" || len(r.ToolCalls) == 0 {
		content = append(content, map[string]any{"type": "text", "text": r.Text})
	}
	stop := "end_turn"
	for i, tc := range r.ToolCalls {
		stop = "tool_use"
		content = append(content, map[string]any{
			"type":  "tool_use",
			"id":    toolCallID(tc, "toolu", id, i),
			"name":  tc.Name,
			"input": argumentsObject(tc.Arguments),
		})
	}
	return mustJSON(map[string]any{
		"id":            fmt.Sprintf("msg_fake%d", id),
		"type":          "message",
		"role":          "assistant",
		"model":         c.Model,
		"content":       content,
		"stop_reason":   stop,
		"stop_sequence": nil,
		"usage": map[string]any{
			"input_tokens":                r.InputTokens,
			"output_tokens":               r.OutputTokens,
			"cache_creation_input_tokens": 0,
			"cache_read_input_tokens":     0,
		},
	})
}

func (anthropicWire) fail(status int, msg string) []byte {
	typ := "api_error"
	switch status {
	case http.StatusBadRequest:
		typ = "invalid_request_error"
	case http.StatusUnauthorized:
		typ = "authentication_error"
	case http.StatusForbidden:
		typ = "permission_error"
	case http.StatusNotFound:
		typ = "not_found_error"
	case http.StatusRequestEntityTooLarge:
		typ = "request_too_large"
	case http.StatusTooManyRequests:
		typ = "rate_limit_error"
	case 529:
		typ = "overloaded_error"
	}
	return mustJSON(map[string]any{
		"type":  "error",
		"error": map[string]any{"type": typ, "message": msg},
	})
}

// mustJSON encodes v, which holds only types that always encode.
func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		return []byte(`{"error":{"message":"fake provider: encoding the answer failed"}}`)
	}
	return b
}
