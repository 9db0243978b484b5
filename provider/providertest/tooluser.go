package providertest

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/palrun/pal/provider"
)

// ToolUser answers as a model that uses the tools it is offered, for pal
// dev's demo: a request that offers tools it has not called yet in this
// conversation gets one turn calling each of them once, with arguments
// made from the tool's JSON Schema (its required properties, the user's
// last message for a string); a request whose tools have all been called
// gets a final answer that quotes their results. A request without tools
// gets the default answer ("echo: " and the last user message).
//
// Pass it to SetResponder.
func ToolUser(c Call) Reply {
	called := map[string]bool{}
	var results []string
	names := map[string]string{} // tool call id → tool name
	for _, m := range c.Messages {
		for _, tc := range m.ToolCalls {
			called[tc.Name] = true
			names[tc.ID] = tc.Name
		}
		if m.Role == provider.RoleTool {
			results = append(results, fmt.Sprintf("%s returned %s", orUnknown(names[m.ToolCallID]), clipText(m.Content, 200)))
		}
	}
	schemas := toolSchemas(c)
	var calls []provider.ToolCall
	for i, name := range c.Tools {
		if called[name] {
			continue
		}
		args, _ := json.Marshal(exampleOf(schemas[name], c.LastUser(), 0))
		calls = append(calls, provider.ToolCall{ID: fmt.Sprintf("call_%d_%d", len(c.Messages), i), Name: name, Arguments: args})
	}
	if len(calls) > 0 {
		return Reply{ToolCalls: calls}
	}
	text := "echo: " + c.LastUser()
	if len(results) > 0 {
		text += " (" + strings.Join(results, "; ") + ")"
	}
	return Reply{Text: text}
}

func orUnknown(s string) string {
	if s == "" {
		return "a tool"
	}
	return s
}

func clipText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// toolSchemas reads the offered tools' parameter schemas from the
// request's body, in either wire format.
func toolSchemas(c Call) map[string]json.RawMessage {
	var body struct {
		Tools []struct {
			// OpenAI: {"type":"function","function":{name, parameters}}.
			Function struct {
				Name       string          `json:"name"`
				Parameters json.RawMessage `json:"parameters"`
			} `json:"function"`
			// Anthropic: {name, input_schema}.
			Name        string          `json:"name"`
			InputSchema json.RawMessage `json:"input_schema"`
		} `json:"tools"`
	}
	out := map[string]json.RawMessage{}
	if json.Unmarshal(c.Body, &body) != nil {
		return out
	}
	for _, t := range body.Tools {
		if t.Function.Name != "" {
			out[t.Function.Name] = t.Function.Parameters
		} else if t.Name != "" {
			out[t.Name] = t.InputSchema
		}
	}
	return out
}

// maxExampleDepth bounds how deep exampleOf follows nested objects.
const maxExampleDepth = 4

// exampleOf makes a value that fits schema: its enum's first value, else
// one of its type, an object holding its required properties (all its
// properties when none is required); text is what a string gets.
func exampleOf(raw json.RawMessage, text string, depth int) any {
	var s struct {
		Type       any                        `json:"type"`
		Enum       []any                      `json:"enum"`
		Properties map[string]json.RawMessage `json:"properties"`
		Required   []string                   `json:"required"`
		Items      json.RawMessage            `json:"items"`
	}
	if len(raw) == 0 || json.Unmarshal(raw, &s) != nil {
		return map[string]any{}
	}
	if len(s.Enum) > 0 {
		return s.Enum[0]
	}
	typ, _ := s.Type.(string)
	if list, ok := s.Type.([]any); ok && len(list) > 0 {
		typ, _ = list[0].(string)
	}
	switch typ {
	case "string":
		return text
	case "integer", "number":
		return 1
	case "boolean":
		return true
	case "array":
		if depth >= maxExampleDepth {
			return []any{}
		}
		return []any{exampleOf(s.Items, text, depth+1)}
	case "null":
		return nil
	}
	obj := map[string]any{}
	if depth >= maxExampleDepth {
		return obj
	}
	keys := s.Required
	if len(keys) == 0 {
		for k := range s.Properties {
			keys = append(keys, k)
		}
		sort.Strings(keys)
	}
	for _, k := range keys {
		obj[k] = exampleOf(s.Properties[k], text, depth+1)
	}
	return obj
}
