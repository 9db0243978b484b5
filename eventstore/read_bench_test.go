package eventstore_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
)

// BenchmarkReadTail measures ReadAfter of the last 2,500 events of a
// 5,000-event journal of one event per message (a step_started and a
// step_completed per step), as a resume from a snapshot behind the
// journal's end reads it.
//
//	go test -run '^$' -bench ReadTail ./eventstore/
func BenchmarkReadTail(b *testing.B) {
	bd := setup(b, eventstore.Config{})
	ctx := b.Context()
	const runID, events, tail = "run_readtail", 5_000, 2_500
	evs := []event.Event{event.MustNew(event.RunCreated, "", 0, event.RunCreatedData{Workflow: json.RawMessage(`{}`)})}
	for i := 0; len(evs) < events; i++ {
		id := fmt.Sprintf("each[%d].echo", i)
		evs = append(evs,
			event.MustNew(event.StepStarted, id, 1, event.StepStartedData{NodeID: "echo", NodeType: "tool",
				Input: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i)), IdempotencyKey: runID + ":" + id + ":1"}),
			event.MustNew(event.StepCompleted, id, 1, event.StepCompletedData{Output: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))}))
	}
	var head, from eventstore.Head
	for i, ev := range evs[:events] {
		ev.WorkerID = "w"
		h, err := bd.store.Append(ctx, runID, head, ev)
		if err != nil {
			b.Fatal(err)
		}
		head = h
		if i+1 == events-tail {
			from = head
		}
	}
	b.ResetTimer()
	for range b.N {
		got, _, err := bd.store.ReadAfter(ctx, runID, from)
		if err != nil || len(got) != tail {
			b.Fatalf("%d events, %v", len(got), err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*tail), "µs/event")
}

// BenchmarkReadFresh measures Read of a one-event journal, as a fresh
// run's first drive reads it: one Direct Get over the connection's shared
// reply subscription (store.go's scan).
//
//	go test -run '^$' -bench ReadFresh ./eventstore/
func BenchmarkReadFresh(b *testing.B) {
	bd := setup(b, eventstore.Config{})
	ctx := b.Context()
	const runID = "run_readfresh"
	ev := event.MustNew(event.RunCreated, "", 0, event.RunCreatedData{Workflow: json.RawMessage(`{}`)})
	ev.WorkerID = "w"
	if _, err := bd.store.Append(ctx, runID, eventstore.Head{}, ev); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		if got, _, err := bd.store.Read(ctx, runID); err != nil || len(got) != 1 {
			b.Fatalf("%d events, %v", len(got), err)
		}
	}
}
