package engine_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
)

func chain(n int) string {
	var nodes, edges []string
	nodes = append(nodes, `{"id":"start","type":"trigger"}`)
	prev := "start"
	for i := 1; i <= n; i++ {
		id := fmt.Sprintf("s%d", i)
		nodes = append(nodes, fmt.Sprintf(`{"id":%q,"type":"tool","data":{"tool":"echo","input":{"i":%d}}}`, id, i))
		edges = append(edges, fmt.Sprintf(`{"from":%q,"to":%q}`, prev, id))
		prev = id
	}
	return fmt.Sprintf(`{"name":"chain","nodes":[%s],"edges":[%s]}`, strings.Join(nodes, ","), strings.Join(edges, ","))
}

// BenchmarkNextDeepInChain measures Next for the last step of a long chain
// of completed steps: the interpreter's cost per step for big workflows.
func BenchmarkNextDeepInChain(b *testing.B) {
	for _, n := range []int{10, 100, 500} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			h := newHistory(b, testRun, chain(n), `{}`).resume("w")
			for i := 1; i < n; i++ {
				id := fmt.Sprintf("s%d", i)
				h.start(id)
				h.append(event.StepCompleted, id, 1, event.StepCompletedData{Output: json.RawMessage(`{"i":1}`)})
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if _, ok := engine.Next(h.st.Workflow, h.st, h.now).(engine.RunStep); !ok {
					b.Fatal("want a step")
				}
			}
		})
	}
}

// BenchmarkNextInLoop measures Next late in a loop over many items: every
// iteration's step ids are built and looked up on each call.
func BenchmarkNextInLoop(b *testing.B) {
	const n = 100
	items := make([]string, n)
	for i := range items {
		items[i] = fmt.Sprint(i)
	}
	in, _ := json.Marshal(map[string]any{"urls": items, "tag": "t"})
	h := newHistory(b, testRun, wfLoop, string(in)).resume("w")
	for i := 0; i < n-1; i++ {
		for _, node := range []string{"fetch", "sum"} {
			id := engine.NodeStep("each").InIteration(i, node).String()
			h.start(id)
			h.append(event.StepCompleted, id, 1, event.StepCompletedData{Output: json.RawMessage(`{"n":1}`)})
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, ok := engine.Next(h.st.Workflow, h.st, h.now).(engine.RunStep); !ok {
			b.Fatal("want a step")
		}
	}
}
