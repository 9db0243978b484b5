package workers_test

import (
	"context"
	"testing"
	"time"

	"github.com/palrun/pal/cmd/pal/palbench"
)

// BenchmarkStepOverhead measures one sequential run of no-op tool steps:
// the wall time of a step, journal included (the gap between consecutive
// step_completed events), for each durability mode. Run it with
//
//	go test -run '^$' -bench StepOverhead -benchtime 1x ./workers/
func BenchmarkStepOverhead(b *testing.B) {
	for _, mode := range []struct {
		name   string
		strict bool
	}{{"process", false}, {"strict", true}} {
		b.Run(mode.name, func(b *testing.B) {
			env := startBench(b, mode.strict)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			for range b.N {
				res, err := env.Runs(ctx, 1, 500)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(res.Percentile(0.5).Microseconds()), "p50-µs/step")
				b.ReportMetric(float64(res.Percentile(0.99).Microseconds()), "p99-µs/step")
				b.ReportMetric(res.StepsPerSecond(), "steps/s")
			}
		})
	}
}

// BenchmarkConcurrentRuns measures throughput with 64 runs of 50 no-op
// steps at once, for each durability mode.
func BenchmarkConcurrentRuns(b *testing.B) {
	for _, mode := range []struct {
		name   string
		strict bool
	}{{"process", false}, {"strict", true}} {
		b.Run(mode.name, func(b *testing.B) {
			env := startBench(b, mode.strict)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			for range b.N {
				res, err := env.Runs(ctx, 64, 50)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(res.StepsPerSecond(), "steps/s")
				b.ReportMetric(float64(res.Percentile(0.5).Microseconds()), "p50-µs/step")
			}
		})
	}
}

func startBench(b *testing.B, strict bool) *palbench.Env {
	b.Helper()
	return startBenchWith(b, palbench.Options{Strict: strict})
}

func startBenchWith(b *testing.B, o palbench.Options) *palbench.Env {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	o.Dir, o.Concurrency = b.TempDir(), 64
	env, err := palbench.Start(ctx, o)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(env.Close)
	if _, err := env.Runs(ctx, 4, 10); err != nil { // warm up
		b.Fatal(err)
	}
	b.ResetTimer()
	return env
}

// BenchmarkWorkflowFixedCost measures what a workflow costs beyond its
// steps: start command to a watching client seeing the end, for runs of 1
// and of 11 no-op steps one after another; the fixed cost is the 1-step
// time less one step's share of the difference.
//
// over loopback TCP (tcp; tcp-named starts a deployed workflow by name
// instead of bringing its definition), and in-process (in-process, the
// connection pal dev's worker has to its embedded server).
//
//	go test -run '^$' -bench WorkflowFixedCost -benchtime 1x ./workers/
func BenchmarkWorkflowFixedCost(b *testing.B) {
	for _, c := range []struct {
		name          string
		inProc, named bool
	}{{"tcp", false, false}, {"tcp-named", false, true}, {"in-process", true, false}} {
		b.Run(c.name, func(b *testing.B) { workflowFixedCost(b, c.inProc, c.named) })
	}
}

func workflowFixedCost(b *testing.B, inProc, named bool) {
	env := startBenchWith(b, palbench.Options{InProcess: inProc})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for range b.N {
		one, err := env.Latencies(ctx, 300, 1, named)
		if err != nil {
			b.Fatal(err)
		}
		eleven, err := env.Latencies(ctx, 300, 11, named)
		if err != nil {
			b.Fatal(err)
		}
		m1, m11 := palbench.Median(one), palbench.Median(eleven)
		step := (m11 - m1) / 10
		fixed := m1 - step
		b.ReportMetric(float64(m1.Microseconds()), "p50-µs/1-step-run")
		b.ReportMetric(float64(m11.Microseconds()), "p50-µs/11-step-run")
		b.ReportMetric(float64(step.Microseconds()), "µs/step")
		b.ReportMetric(float64(fixed.Microseconds()), "µs-fixed/run")
	}
}

// BenchmarkFanOut measures one run fanning out to 1,000 no-op steps, 64
// in flight at once, beside 64 separate runs of 16 steps on the same
// worker, for each durability mode; fanout/concurrent is their ratio.
//
//	go test -run '^$' -bench FanOut -benchtime 1x ./workers/
func BenchmarkFanOut(b *testing.B) {
	for _, mode := range []struct {
		name   string
		strict bool
	}{{"process", false}, {"strict", true}} {
		b.Run(mode.name, func(b *testing.B) {
			env := startBenchWith(b, palbench.Options{Strict: mode.strict, RunConcurrency: 64})
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			for range b.N {
				conc, err := env.Runs(ctx, 64, 16)
				if err != nil {
					b.Fatal(err)
				}
				fan, err := env.FanOut(ctx, 1000, 64)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(fan.StepsPerSecond(), "fanout-steps/s")
				b.ReportMetric(conc.StepsPerSecond(), "concurrent-steps/s")
				b.ReportMetric(fan.StepsPerSecond()/conc.StepsPerSecond(), "fanout/concurrent")
			}
		})
	}
}
