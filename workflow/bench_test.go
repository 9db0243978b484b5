package workflow_test

import (
	"encoding/json"
	"os"
	"testing"

	"github.com/palrun/pal/workflow"
)

func BenchmarkParse(b *testing.B) {
	raw, err := os.ReadFile("testdata/valid/branching.json")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := workflow.Parse(raw); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRenderJSON(b *testing.B) {
	env := testEnv(b)
	body := json.RawMessage(`{"summary":"{{steps.draft.output.text}}","score":"{{steps.draft.output.score}}",` +
		`"first":"{{steps.fetch.output.items[0]}}","note":"{{input.user.name}} ({{input.user.age}})"}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := workflow.RenderJSON(body, env); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEdgeFires(b *testing.B) {
	raw, err := os.ReadFile("testdata/valid/branching.json")
	if err != nil {
		b.Fatal(err)
	}
	w, err := workflow.Parse(raw)
	if err != nil {
		b.Fatal(err)
	}
	env := workflow.Env{
		Input: map[string]any{"archive": true},
		Steps: map[string]any{"urgent": json.RawMessage(`{"result":false}`), "classify": json.RawMessage(`{"label":"x"}`)},
	}
	e := w.Outgoing("urgent")[1]
	b.ReportAllocs()
	for b.Loop() {
		if _, err := w.EdgeFires(e, env); err != nil {
			b.Fatal(err)
		}
	}
}
