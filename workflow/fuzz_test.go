package workflow_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/workflow"
)

func addTestdataSeeds(f *testing.F) {
	f.Helper()
	files, err := filepath.Glob("testdata/*/*.json")
	require.NoError(f, err)
	for _, file := range files {
		raw, err := os.ReadFile(file)
		require.NoError(f, err)
		f.Add(raw)
	}
	f.Add([]byte(diamond))
	f.Add([]byte(conditionWorkflow))
	f.Add([]byte(`{"name":"x","nodes":[{"id":"s","type":"trigger"}],"edges":[{"from":"s","to":"s"}]}`))
	f.Add([]byte(`{"name":"x","nodes":[{"id":"s","type":"trigger"},{"id":"a","type":"tool","data":{"tool":"t","input":"{{steps.a.output}}"}}],"edges":[{"from":"s","to":"a"}]}`))
	f.Add([]byte(`[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]`))
	f.Add([]byte(`{"name":"\u00e9\ud800","nodes":null}`))
}

// FuzzParse checks that Parse never panics, that every refusal is a
// *ValidationError, and that what it accepts is consistent.
func FuzzParse(f *testing.F) {
	addTestdataSeeds(f)
	f.Fuzz(func(t *testing.T, raw []byte) {
		w, err := workflow.Parse(raw)
		if err != nil {
			require.Nil(t, w)
			var ve *workflow.ValidationError
			require.True(t, errors.As(err, &ve), "unexpected error type %T: %v", err, err)
			require.NotEmpty(t, ve.Problems)
			require.True(t, strings.HasPrefix(err.Error(), "workflow"))
			return
		}

		require.True(t, json.Valid(w.Raw()))
		require.Len(t, w.Hash(), 64)

		// Order is a topological permutation of the nodes.
		order := w.Order()
		require.Len(t, order, len(w.Nodes))
		pos := map[string]int{}
		for i, id := range order {
			_, ok := w.Node(id)
			require.True(t, ok)
			pos[id] = i
		}
		require.Len(t, pos, len(w.Nodes))
		for _, e := range w.Edges {
			require.Less(t, pos[e.From], pos[e.To], "edge %s→%s", e.From, e.To)
		}
		require.Equal(t, order[0], w.Trigger().ID)

		// Typed data decodes for every node.
		for i := range w.Nodes {
			n := &w.Nodes[i]
			var err error
			switch n.Type {
			case workflow.TypeAIStep:
				_, err = n.AIStep()
			case workflow.TypeTool:
				_, err = n.Tool()
			case workflow.TypeConnector:
				_, err = n.Connector()
			case workflow.TypeCondition:
				_, err = n.Condition()
			}
			require.NoError(t, err)
			_ = n.Retry()
		}

		// Parsing the compact form gives the same workflow.
		w2, err := workflow.Parse(w.Raw())
		require.NoError(t, err)
		require.Equal(t, w.Hash(), w2.Hash())
		require.Equal(t, order, w2.Order())
	})
}

// FuzzRenderString checks that rendering never panics and is deterministic.
func FuzzRenderString(f *testing.F) {
	for _, s := range []string{
		"", "plain", "{{input.text}}", "a {{ steps.draft.output.usage.tokens }} b", `\{{x}}`,
		"{{input.tags[1]}}{{input.tags[9]}}", "{{", "}}{{}}", "{{input.a[", "{{steps.x.output[0][1].y}}",
	} {
		f.Add(s)
	}
	env := testEnv(f)
	f.Fuzz(func(t *testing.T, s string) {
		a, errA := workflow.RenderString(s, env)
		b, errB := workflow.RenderString(s, env)
		require.Equal(t, a, b)
		require.Equal(t, errA, errB)
		if !strings.Contains(s, "{{") {
			require.NoError(t, errA)
			require.Equal(t, s, a)
		}
	})
}
