package providertest

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/palrun/pal/provider"
)

// The Anthropic Messages wire format: POST /v1/messages, answered as one
// JSON object, or with "stream": true as server-sent events (message_start,
// content_block_start/delta/stop per block, message_delta, message_stop).

type anthropicWire struct{}

type anRequest struct {
	Model     string          `json:"model"`
	MaxTokens int             `json:"max_tokens"`
	System    json.RawMessage `json:"system"`
	Messages  []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	Tools []struct {
		Name string `json:"name"`
	} `json:"tools"`
	Stream       bool `json:"stream"`
	OutputConfig struct {
		Format struct {
			Type   string          `json:"type"`
			Schema json.RawMessage `json:"schema"`
		} `json:"format"`
	} `json:"output_config"`
}

type anBlock struct {
	Type      string          `json:"type"`
	Text      string          `json:"text"`
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
	Source    struct {
		Type      string `json:"type"`
		MediaType string `json:"media_type"`
		Data      string `json:"data"`
		URL       string `json:"url"`
	} `json:"source"`
}

func (anthropicWire) name() string { return Anthropic }

func (anthropicWire) parse(c *Call) error {
	var req anRequest
	if err := json.Unmarshal(c.Body, &req); err != nil {
		return fmt.Errorf("body is not a messages request: %w", err)
	}
	c.Model, c.MaxTokens, c.Stream, c.streamUsage = req.Model, req.MaxTokens, req.Stream, req.Stream
	if f := req.OutputConfig.Format; f.Type == "json_schema" {
		c.ResponseSchema = f.Schema
	}
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
		var images []provider.Image
		for _, b := range blocks {
			switch b.Type {
			case "text":
				text.WriteString(b.Text)
			case "image":
				img, err := anImage(b)
				if err != nil {
					return err
				}
				images = append(images, img)
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
		case text.Len() > 0 || len(images) > 0 || len(blocks) == 0:
			c.Messages = append(c.Messages, provider.Message{Role: m.Role, Content: text.String(), Images: images})
		}
	}
	c.System = strings.Join(systems, "\n\n")
	for _, t := range req.Tools {
		c.Tools = append(c.Tools, t.Name)
	}
	return nil
}

// anImage reads an image block: a URL, or base64 bytes.
func anImage(b anBlock) (provider.Image, error) {
	switch b.Source.Type {
	case "url":
		return provider.Image{URL: b.Source.URL}, nil
	case "base64":
		data, err := base64.StdEncoding.DecodeString(b.Source.Data)
		if err != nil {
			return provider.Image{}, fmt.Errorf("image: %w", err)
		}
		return provider.Image{MediaType: b.Source.MediaType, Data: data}, nil
	}
	return provider.Image{}, fmt.Errorf("image source type %q (want base64 or url)", b.Source.Type)
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

// anStop is the stop reason of an answer.
func anStop(r Reply) string {
	if len(r.ToolCalls) > 0 {
		return "tool_use"
	}
	return "end_turn"
}

// anUsage is the usage object of an answer: input_tokens counts the input
// that was neither read from nor written to the cache.
func anUsage(r Reply) map[string]any {
	u := map[string]any{
		"input_tokens":                max(r.InputTokens-r.CacheReadTokens-r.CacheWriteTokens, 0),
		"output_tokens":               r.OutputTokens,
		"cache_creation_input_tokens": r.CacheWriteTokens,
		"cache_read_input_tokens":     r.CacheReadTokens,
	}
	if r.ReasoningTokens > 0 {
		u["output_tokens_details"] = map[string]any{"thinking_tokens": r.ReasoningTokens}
	}
	return u
}

func (anthropicWire) reply(c Call, r Reply, id int) []byte {
	content := []any{}
	if r.Reasoning != "" {
		content = append(content, map[string]any{"type": "thinking", "thinking": r.Reasoning, "signature": "fake"})
	}
	if r.Text != "" || len(r.ToolCalls) == 0 {
		content = append(content, map[string]any{"type": "text", "text": r.Text})
	}
	for i, tc := range r.ToolCalls {
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
		"stop_reason":   anStop(r),
		"stop_sequence": nil,
		"usage":         anUsage(r),
	})
}

func (anthropicWire) frames(c Call, r Reply, id int) []frame {
	ev := func(name string, body map[string]any) frame {
		body["type"] = name
		return frame{event: name, data: mustJSON(body)}
	}
	start := anUsage(r)
	start["output_tokens"] = 0
	out := []frame{ev("message_start", map[string]any{"message": map[string]any{
		"id": fmt.Sprintf("msg_fake%d", id), "type": "message", "role": "assistant", "model": c.Model,
		"content": []any{}, "stop_reason": nil, "stop_sequence": nil, "usage": start,
	}})}
	index := 0
	block := func(start map[string]any, deltaType, field string, words []string) {
		out = append(out, ev("content_block_start", map[string]any{"index": index, "content_block": start}))
		for _, w := range words {
			d := ev("content_block_delta", map[string]any{"index": index, "delta": map[string]any{"type": deltaType, field: w}})
			d.delta = true
			out = append(out, d)
		}
		out = append(out, ev("content_block_stop", map[string]any{"index": index}))
		index++
	}
	if r.Reasoning != "" {
		block(map[string]any{"type": "thinking", "thinking": "", "signature": ""}, "thinking_delta", "thinking", pieces(r.Reasoning))
	}
	if r.Text != "" || len(r.ToolCalls) == 0 {
		block(map[string]any{"type": "text", "text": ""}, "text_delta", "text", pieces(r.Text))
	}
	for i, tc := range r.ToolCalls {
		out = append(out, ev("content_block_start", map[string]any{"index": index, "content_block": map[string]any{
			"type": "tool_use", "id": toolCallID(tc, "toolu", id, i), "name": tc.Name, "input": map[string]any{}}}))
		out = append(out, ev("content_block_delta", map[string]any{"index": index, "delta": map[string]any{
			"type": "input_json_delta", "partial_json": string(argumentsObject(tc.Arguments))}}))
		out = append(out, ev("content_block_stop", map[string]any{"index": index}))
		index++
	}
	end := map[string]any{"output_tokens": r.OutputTokens}
	if r.ReasoningTokens > 0 {
		end["output_tokens_details"] = map[string]any{"thinking_tokens": r.ReasoningTokens}
	}
	out = append(out, ev("message_delta", map[string]any{"delta": map[string]any{"stop_reason": anStop(r), "stop_sequence": nil}, "usage": end}))
	return append(out, ev("message_stop", map[string]any{}))
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
