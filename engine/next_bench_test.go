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
				if _, ok := engine.Next(h.st.Workflow, h.st).(engine.RunStep); !ok {
					b.Fatal("want a step")
				}
			}
		})
	}
}
