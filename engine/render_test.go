package engine_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/workflow"
)

func TestRenderInput(t *testing.T) {
	t.Parallel()
	env := workflow.Env{
		Input: map[string]any{"text": "hello", "n": json.Number("3"), "hook": "https://example.test/h"},
		Steps: map[string]any{"draft": json.RawMessage(`{"text":"hi","items":[{"id":7}]}`)},
	}
	tests := []struct {
		name string
		node workflow.Node
		want string
		err  string
	}{
		{"ai-step prompt", workflow.Node{ID: "a", Type: workflow.TypeAIStep,
			Data: json.RawMessage(`{"provider":"openai","model":"m","prompt":"Say {{input.text}}"}`)},
			`{"provider":"openai","model":"m","messages":[{"role":"user","content":"Say hello"}]}`, ""},
		{"ai-step messages, then prompt", workflow.Node{ID: "a", Type: workflow.TypeAIStep,
			Data: json.RawMessage(`{"provider":"anthropic","model":"m","system":"Sys {{input.n}}","maxTokens":9,"temperature":0,
				"messages":[{"role":"assistant","content":"{{steps.draft.output.text}}"}],"prompt":"p"}`)},
			`{"provider":"anthropic","model":"m","system":"Sys 3","maxTokens":9,"temperature":0,
				"messages":[{"role":"assistant","content":"hi"},{"role":"user","content":"p"}]}`, ""},
		{"ai-step bad system", workflow.Node{ID: "a", Type: workflow.TypeAIStep,
			Data: json.RawMessage(`{"provider":"openai","model":"m","system":"{{input.nope}}","prompt":"p"}`)}, "", "system:"},
		{"ai-step bad message", workflow.Node{ID: "a", Type: workflow.TypeAIStep,
			Data: json.RawMessage(`{"provider":"openai","model":"m","messages":[{"role":"user","content":"ok"},{"role":"user","content":"{{steps.x.output}}"}]}`)},
			"", "messages[1]:"},
		{"tool", workflow.Node{ID: "t", Type: workflow.TypeTool,
			Data: json.RawMessage(`{"tool":"fetch","input":{"id":"{{steps.draft.output.items[0].id}}","q":"{{input.text}}!"}}`)},
			`{"tool":"fetch","input":{"id":7,"q":"hello!"}}`, ""},
		{"tool without input", workflow.Node{ID: "t", Type: workflow.TypeTool, Data: json.RawMessage(`{"tool":"now"}`)},
			`{"tool":"now","input":null}`, ""},
		{"tool bad input", workflow.Node{ID: "t", Type: workflow.TypeTool,
			Data: json.RawMessage(`{"tool":"x","input":["{{input.missing}}"]}`)}, "", "missing"},
		{"connector defaults to POST", workflow.Node{ID: "c", Type: workflow.TypeConnector,
			Data: json.RawMessage(`{"kind":"webhook","url":"{{input.hook}}","headers":{"X-N":"{{input.n}}"},"body":{"t":"{{steps.draft.output.text}}"}}`)},
			`{"kind":"webhook","url":"https://example.test/h","method":"POST","headers":{"X-N":"3"},"body":{"t":"hi"}}`, ""},
		{"connector method, no body", workflow.Node{ID: "c", Type: workflow.TypeConnector,
			Data: json.RawMessage(`{"kind":"webhook","url":"https://example.test/x","method":"DELETE"}`)},
			`{"kind":"webhook","url":"https://example.test/x","method":"DELETE"}`, ""},
		{"connector bad url", workflow.Node{ID: "c", Type: workflow.TypeConnector,
			Data: json.RawMessage(`{"kind":"webhook","url":"{{input.nope}}"}`)}, "", "url:"},
		{"connector bad header", workflow.Node{ID: "c", Type: workflow.TypeConnector,
			Data: json.RawMessage(`{"kind":"webhook","url":"https://e.test","headers":{"X":"{{input.nope}}"}}`)}, "", "headers.X:"},
		{"connector bad body", workflow.Node{ID: "c", Type: workflow.TypeConnector,
			Data: json.RawMessage(`{"kind":"webhook","url":"https://e.test","body":{"a":"{{input.nope}}"}}`)}, "", "body:"},
		{"condition", workflow.Node{ID: "k", Type: workflow.TypeCondition, Data: json.RawMessage(`{"expression":"input.n > 2"}`)},
			`{"expression":"input.n > 2"}`, ""},
		{"trigger cannot run", workflow.Node{ID: "start", Type: workflow.TypeTrigger}, "", `node type "trigger" cannot run here`},
		{"node without data", workflow.Node{ID: "a", Type: workflow.TypeAIStep}, "", "has no data"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := engine.RenderInput(&tt.node, env)
			if tt.err != "" {
				require.ErrorContains(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			require.JSONEq(t, tt.want, string(got))
			// Rendering is pure.
			again, err := engine.RenderInput(&tt.node, env)
			require.NoError(t, err)
			require.Equal(t, string(got), string(again))
		})
	}
}
