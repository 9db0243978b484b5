package workers_test

import (
	"encoding/json"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/provider/providertest"
)

// BenchmarkDeltaLatency times a delta from the fake provider writing it
// (flushed to the worker's streaming call) to a watcher subscribed to the
// run's delta subject receiving it, over a step of 10,000 deltas a
// millisecond apart, through an in-process worker and the SDK's stream:
// p50 and p99 in milliseconds. Run it with
//
//	go test -run '^$' -bench BenchmarkDeltaLatency -benchtime 1x ./workers/
func BenchmarkDeltaLatency(b *testing.B) {
	const deltas = 10_000
	bb := paltest.New(b)
	bb.Worker(b, "w1")
	bb.LLM.SetPace(time.Millisecond)
	bb.LLM.SetResponder(func(providertest.Call) providertest.Reply { return providertest.Reply{Text: answer(deltas)} })
	var mu sync.Mutex
	written := map[int]time.Time{}
	bb.LLM.OnDelta(func(_ providertest.Call, i int) {
		now := time.Now()
		mu.Lock()
		written[i] = now
		mu.Unlock()
	})
	watcher := bb.NATS.Conn(b)
	var lat []time.Duration
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		received := make(chan struct{})
		mu.Lock()
		clear(written)
		mu.Unlock()
		var got []struct {
			index int
			at    time.Time
		}
		// One run at a time: the run's subject is the only one that gets
		// deltas.
		sub, err := watcher.Subscribe(eventstore.DeltaPrefix+"*", func(m *nats.Msg) {
			at := time.Now()
			var d event.Delta
			if json.Unmarshal(m.Data, &d) != nil {
				return
			}
			got = append(got, struct {
				index int
				at    time.Time
			}{d.Index, at})
			if len(got) == deltas {
				close(received)
			}
		})
		require.NoError(b, err)
		require.NoError(b, sub.SetPendingLimits(-1, -1))
		b.StartTimer()
		runID := bb.Start(b, streamWorkflow, `{}`)
		<-received
		b.StopTimer()
		require.NoError(b, sub.Unsubscribe())
		require.Equal(b, event.RunSucceeded, bb.WaitEnd(b, runID).Kind)
		mu.Lock()
		for _, g := range got {
			if w, ok := written[g.index]; ok {
				lat = append(lat, g.at.Sub(w))
			}
		}
		mu.Unlock()
	}
	require.NotEmpty(b, lat)
	slices.Sort(lat)
	pct := func(p float64) float64 {
		return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))].Microseconds()) / 1000
	}
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	b.ReportMetric(float64(len(lat)), "deltas")
}
