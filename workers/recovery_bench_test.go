package workers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/paltest/testenv"
	"github.com/palrun/pal/provider/providertest"
	"github.com/palrun/pal/runs"
)

// BenchmarkRecoveryAfterKill measures, over PAL_BENCH_KILLS kills (default
// 20), the time from kill -9 of the pal worker process driving a run to the
// moment another, already running, worker appends run_resumed. It uses
// PAL's default lease TTL unless PAL_LEASE_TTL is set:
//
//	go test -run '^$' -bench RecoveryAfterKill -benchtime 1x ./workers/
//	PAL_LEASE_TTL=1s go test -run '^$' -bench RecoveryAfterKill -benchtime 1x ./workers/
func BenchmarkRecoveryAfterKill(b *testing.B) {
	kills := 20
	if v := os.Getenv("PAL_BENCH_KILLS"); v != "" {
		if _, err := fmt.Sscan(v, &kills); err != nil || kills < 1 {
			b.Fatalf("PAL_BENCH_KILLS=%q: want a positive number", v)
		}
	}
	ttl := os.Getenv("PAL_LEASE_TTL")
	for range b.N {
		lat := recoveryRun(b, kills, ttl)
		slices.Sort(lat)
		p50, p99, top := lat[len(lat)/2], lat[(len(lat)*99)/100], lat[len(lat)-1]
		b.ReportMetric(float64(p50.Milliseconds()), "p50-ms")
		b.ReportMetric(float64(p99.Milliseconds()), "p99-ms")
		b.ReportMetric(float64(top.Milliseconds()), "max-ms")
		b.Logf("recovery after kill -9, %d kills, PAL_LEASE_TTL=%q: p50 %v  p99 %v  max %v", kills, ttl, p50, p99, top)
	}
}

func recoveryRun(tb testing.TB, kills int, ttl string) []time.Duration {
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(kills)*30*time.Second)
	defer cancel()
	ns := testenv.NATS(tb)
	nc := ns.Conn(tb)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	cfg := eventstore.Config{}
	if ttl != "" {
		d, err := time.ParseDuration(ttl)
		if err != nil {
			tb.Fatalf("PAL_LEASE_TTL=%q: %v", ttl, err)
		}
		cfg.LeaseTTL = d
	}
	if err := eventstore.Setup(ctx, js, cfg); err != nil {
		tb.Fatal(err)
	}
	store, err := eventstore.Open(ctx, js)
	if err != nil {
		tb.Fatal(err)
	}
	llm := providertest.NewServer(tb)
	bin := testenv.PalBinary(tb)
	start := func(id string) *testenv.Process {
		env := append([]string{"PAL_NATS_URL=" + ns.URL(), "PAL_WORKER_ID=" + id}, llm.Env()...)
		if ttl != "" {
			env = append(env, "PAL_LEASE_TTL="+ttl)
		}
		p := testenv.StartProcess(tb, bin, []string{"worker"}, env)
		if err := p.WaitForOutput(ctx, "worker ready"); err != nil {
			tb.Fatalf("worker %s: %v\n%s", id, err, p.Output())
		}
		return p
	}
	procs := map[string]*testenv.Process{"a": start("a"), "b": start("b")}
	var lat []time.Duration
	for i := range kills {
		runID := event.NewRunID()
		hold := llm.Hold(providertest.ByKey(event.IdempotencyKey(runID, "s2", 1)))
		if _, err := runs.New(store).Start(ctx, runs.StartCommand{Rights: runs.AllRights, RunID: runID,
			Workflow: json.RawMessage(seqWorkflow(3, "openai")), Input: json.RawMessage(`{"topic":"recovery"}`)}); err != nil {
			tb.Fatal(err)
		}
		if _, err := hold.Wait(ctx); err != nil {
			tb.Fatalf("kill %d: step 2 never started: %v", i, err)
		}
		evs, _, err := store.Read(ctx, runID)
		if err != nil {
			tb.Fatal(err)
		}
		driver := find(evs, event.RunResumed, "")[0].WorkerID
		killed := time.Now()
		procs[driver].Kill()
		var resumed event.Event
		err = store.Watch(ctx, runID, eventstore.Head{}, func(ev event.Event) error {
			if ev.Kind == event.RunResumed && ev.WorkerID != driver {
				resumed = ev
				return eventstore.ErrStopWatch
			}
			return nil
		})
		if err != nil {
			tb.Fatalf("kill %d: no other worker resumed run %s: %v", i, runID, err)
		}
		lat = append(lat, resumed.TS.Sub(killed))
		hold.Release()
		procs[driver] = start(driver)
	}
	return lat
}
