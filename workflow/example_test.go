package workflow_test

import (
	"encoding/json"
	"fmt"

	"github.com/palrun/pal/workflow"
)

func ExampleParse() {
	w, err := workflow.Parse([]byte(`{
	  "name": "summarise",
	  "nodes": [
	    {"id": "start", "type": "trigger"},
	    {"id": "draft", "type": "ai-step",
	     "data": {"provider": "openai", "model": "gpt-4o-mini", "prompt": "Summarise: {{input.text}}",
	              "retry": {"maxAttempts": 3, "retryableClasses": ["llm"]}}}
	  ],
	  "edges": [{"from": "start", "to": "draft"}]
	}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(w.Name, w.Order())
	draft, _ := w.Node("draft")
	fmt.Println(draft.Retry().Attempts())
	// Output:
	// summarise [start draft]
	// 3
}

func ExampleParse_invalid() {
	_, err := workflow.Parse([]byte(`{
	  "name": "summarise",
	  "nodes": [
	    {"id": "start", "type": "trigger"},
	    {"id": "draft", "type": "ai-step", "data": {"provider": "openai", "prompt": "{{input.text}}"}},
	    {"id": "y", "type": "z"}
	  ],
	  "edges": [{"from": "start", "to": "draft"}]
	}`))
	fmt.Println(err)
	// Output:
	// workflow "summarise": node "draft": data.model: missing required field (an ai-step needs provider, model, and prompt or messages); node "y": unknown type "z" (want one of trigger, ai-step, tool, connector, condition, approval, loop, subagent, agent, process, wait)
}

func ExampleRenderJSON() {
	env := workflow.Env{
		Input: map[string]any{"user": "ada"},
		Steps: map[string]any{"fetch": json.RawMessage(`{"items":[{"id":7,"tags":["a"]}]}`)},
	}
	out, err := workflow.RenderJSON(json.RawMessage(
		`{"first":"{{steps.fetch.output.items[0]}}","id":"{{steps.fetch.output.items[0].id}}","note":"for {{input.user}}: {{steps.fetch.output.items[0].tags}}"}`), env)
	fmt.Println(string(out), err)

	_, err = workflow.RenderString("{{steps.fetch.output.itms}}", env)
	fmt.Println(err)
	// Output:
	// {"first":{"id":7,"tags":["a"]},"id":7,"note":"for ada: [\"a\"]"} <nil>
	// template {{steps.fetch.output.itms}}: steps.fetch.output has no field "itms"
}

func ExampleWorkflow_EdgeFires() {
	w, _ := workflow.Parse([]byte(`{
	  "name": "branch",
	  "nodes": [
	    {"id": "start", "type": "trigger"},
	    {"id": "score", "type": "tool", "data": {"tool": "score"}},
	    {"id": "publish", "type": "tool", "data": {"tool": "publish"}}
	  ],
	  "edges": [
	    {"from": "start", "to": "score"},
	    {"from": "score", "to": "publish", "condition": "steps.score.output.value >= input.threshold"}
	  ]
	}`))
	env := workflow.Env{
		Input: map[string]any{"threshold": 0.8},
		Steps: map[string]any{"score": json.RawMessage(`{"value": 0.93}`)},
	}
	for _, e := range w.Outgoing("score") {
		fires, err := w.EdgeFires(e, env)
		fmt.Println(e.From, "→", e.To, fires, err)
	}
	// Output:
	// score → publish true <nil>
}
