package engine_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
)

// wfLongLoop is a loop of up to 10,000 echo iterations, until a condition
// that never holds.
const wfLongLoop = `{"name":"long","nodes":[{"id":"start","type":"trigger"},
	{"id":"each","type":"loop","data":{"until":"steps.echo.output.i < 0","maxIterations":10000,"body":{"name":"body","nodes":[
		{"id":"start","type":"trigger"},
		{"id":"echo","type":"tool","data":{"tool":"echo","input":{"i":"{{input.index}}"}}}],
		"edges":[{"from":"start","to":"echo"}]}}}],
	"edges":[{"from":"start","to":"each"}]}`

// iterate drives one iteration of wfLongLoop the way a worker does: Next
// (and the anomaly it notes once), step_started, Next, step_completed.
func iterate(h *history, i int) {
	id := engine.NodeStep("each").InIteration(i, "echo").String()
	if n, ok := engine.Next(h.st.Workflow, h.st, h.now).(engine.Note); ok {
		h.append(n.Kind, n.StepID, 0, n.Data) // excessive_steps, at 1,000
	}
	h.start(id)
	h.append(event.StepCompleted, id, 1, event.StepCompletedData{Output: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))})
}

// BenchmarkLoopIteration measures the engine's share of one loop
// iteration (two Next calls and two folded events): the b.N iterations
// up to iteration 100, 1,000 and 10,000. It must not grow with them.
//
//	go test -run '^$' -bench LoopIteration -benchtime 100x ./engine/
func BenchmarkLoopIteration(b *testing.B) {
	for _, n := range []int{100, 1_000, 10_000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			if b.N > n {
				b.Skipf("b.N %d is over %d iterations; use -benchtime 100x", b.N, n)
			}
			h := newHistory(b, testRun, wfLongLoop, `{}`).resume("w")
			for i := range n - b.N {
				iterate(h, i)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				iterate(h, n-b.N+i)
			}
		})
	}
}

// BenchmarkResumeFold measures a resume's engine work on a 20,000-event
// run: folding the journal from scratch and the first Next.
//
//	go test -run '^$' -bench ResumeFold ./engine/
func BenchmarkResumeFold(b *testing.B) {
	h := newHistory(b, testRun, wfLongLoop, `{}`).resume("w")
	for i := 0; len(h.evs) < 20_000; i++ {
		iterate(h, i)
	}
	evs := h.events()
	b.ReportMetric(float64(len(evs)), "events")
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		st, err := engine.Fold(evs)
		if err != nil {
			b.Fatal(err)
		}
		if _, ok := engine.Next(st.Workflow, st, h.now).(engine.RunStep); !ok {
			b.Fatal("want a step")
		}
	}
}
