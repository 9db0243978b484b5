package workers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
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
	"github.com/palrun/pal/workers"
)

// BenchmarkRecoveryAfterKill measures the time from kill -9 of the pal
// worker process driving a run to the moment another, already running,
// worker appends run_resumed, and reports its p50, p99 and max over the
// kills. It uses PAL's default lease TTL unless PAL_LEASE_TTL is set.
//
//   - PAL_BENCH_KILLS: how many kills (default 20; 100 to see a 1% tail).
//   - PAL_BENCH_KILL_PHASE: when, after the step the worker drives has
//     started, it is killed: "random" (default), a delay drawn uniformly
//     from one presence probe interval, so that kills fall at every
//     phase of the survivor's probes; or a fixed delay ("0s", "20ms").
//
// For example:
//
//	go test -run '^$' -bench RecoveryAfterKill -benchtime 1x ./workers/
//	PAL_BENCH_KILLS=100 go test -run '^$' -bench RecoveryAfterKill -benchtime 1x -timeout 30m ./workers/
//	PAL_LEASE_TTL=1s go test -run '^$' -bench RecoveryAfterKill -benchtime 1x ./workers/
func BenchmarkRecoveryAfterKill(b *testing.B) {
	kills := 20
	if v := os.Getenv("PAL_BENCH_KILLS"); v != "" {
		if _, err := fmt.Sscan(v, &kills); err != nil || kills < 1 || kills > 10_000 {
			b.Fatalf("PAL_BENCH_KILLS=%q: want a number from 1 to 10000", v)
		}
	}
	phase := killPhase(b, os.Getenv("PAL_BENCH_KILL_PHASE"))
	ttl := os.Getenv("PAL_LEASE_TTL")
	for range b.N {
		lat := recoveryRun(b, kills, ttl, phase)
		slices.Sort(lat)
		p50, p99, top := percentile(lat, 50), percentile(lat, 99), lat[len(lat)-1]
		b.ReportMetric(float64(p50.Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(p99.Microseconds())/1000, "p99-ms")
		b.ReportMetric(float64(top.Microseconds())/1000, "max-ms")
		b.Logf("recovery after kill -9, %d kills, PAL_LEASE_TTL=%q: p50 %v  p99 %v  max %v",
			kills, ttl, p50.Round(time.Millisecond), p99.Round(time.Millisecond), top.Round(time.Millisecond))
	}
}

// killPhase reads PAL_BENCH_KILL_PHASE: the delay between a step's start
// and the kill of its worker, drawn for each kill.
func killPhase(tb testing.TB, v string) func() time.Duration {
	if v == "" || v == "random" {
		return func() time.Duration { return rand.N(workers.PresenceProbeEvery) }
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 || d > time.Minute {
		tb.Fatalf("PAL_BENCH_KILL_PHASE=%q: want random or a delay from 0s to 1m", v)
	}
	return func() time.Duration { return d }
}

// percentile is the p-th percentile of sorted (nearest rank).
func percentile(sorted []time.Duration, p int) time.Duration {
	i := (len(sorted)*p + 99) / 100
	return sorted[max(i, 1)-1]
}

func recoveryRun(tb testing.TB, kills int, ttl string, phase func() time.Duration) []time.Duration {
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
		delay := phase()
		time.Sleep(delay)
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
		took := resumed.TS.Sub(killed)
		if took > 200*time.Millisecond {
			tb.Logf("kill %d, %v after the step started: run_resumed %v after the kill", i, delay, took.Round(time.Millisecond))
		}
		lat = append(lat, took)
		hold.Release()
		procs[driver] = start(driver)
	}
	return lat
}
