package workers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/palrun/pal/cmd/pal/palbench"
	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/runs"
	"github.com/palrun/pal/workers"
)

// loopWorkflow is a loop of n iterations whose body is one echo tool step
// quoting the iteration's index, until a condition that never holds:
// each iteration journals two events.
func loopWorkflow(n int) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"name":"loop-%d","nodes":[{"id":"start","type":"trigger"},
		{"id":"each","type":"loop","data":{"until":"steps.echo.output.i < 0","maxIterations":%d,"body":{"name":"body","nodes":[
			{"id":"start","type":"trigger"},
			{"id":"echo","type":"tool","data":{"tool":"echo","input":{"i":"{{input.index}}"}}}],
			"edges":[{"from":"start","to":"echo"}]}}}],
		"edges":[{"from":"start","to":"each"}]}`, n, n))
}

// BenchmarkLongRun drives one loop of PAL_BENCH_ITERATIONS (default
// 10,000) echo-tool iterations on a real worker and reports the time of
// one iteration (the gap between consecutive step_completed events,
// median of the 50 iterations up to it) at iterations 100, 1,000 and
// 10,000: a step's cost must not grow with the run's history. It then
// reports what a resume of that run costs: reading its journal (about
// 20,000 events), folding it and the first Next; and, on a copy of the
// run cut mid-way in its last step as a crash leaves it, a resume from a
// snapshot at the cut and from one as far behind it as snapshots are
// apart (workers.SnapshotInterval).
//
//	go test -run '^$' -bench LongRun -benchtime 1x ./workers/
func BenchmarkLongRun(b *testing.B) {
	n := 10_000
	if v := os.Getenv("PAL_BENCH_ITERATIONS"); v != "" {
		if _, err := fmt.Sscan(v, &n); err != nil || n < 100 {
			b.Fatalf("PAL_BENCH_ITERATIONS=%q: want a number of at least 100", v)
		}
	}
	env := startBench(b, false)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	client := runs.New(env.Store)
	for range b.N {
		res, err := client.Start(ctx, runs.StartCommand{Rights: runs.AllRights, Workflow: loopWorkflow(n), By: "bench"})
		if err != nil {
			b.Fatal(err)
		}
		evs := waitRunEnd(ctx, b, env, res.RunID)
		var done []time.Time // step_completed of iteration i's echo
		for _, ev := range evs {
			if ev.Kind == event.StepCompleted && ev.StepID != "each" {
				done = append(done, ev.TS)
			}
		}
		if len(done) != n {
			b.Fatalf("%d iterations completed, want %d", len(done), n)
		}
		at := func(i int) time.Duration {
			gaps := make([]time.Duration, 0, 50)
			for j := i - 50; j < i; j++ {
				gaps = append(gaps, done[j].Sub(done[j-1]))
			}
			return palbench.Median(gaps)
		}
		marks := []int{100, 1_000, n}
		for _, i := range marks {
			if i <= n {
				b.ReportMetric(float64(at(i).Microseconds()), fmt.Sprintf("µs/step@%d", i))
			}
		}
		b.ReportMetric(float64(at(n))/float64(at(100)), "ratio-last/100")
		// The whole loop, which the medians above do not see a drive's
		// stalls in (a snapshot's encode, a GC).
		b.ReportMetric(done[n-1].Sub(done[0]).Seconds(), "s/loop")

		// The resume of the run mid-way in its last iteration: the drive's
		// load (read and fold) and its first decision.
		last := engine.NodeStep("each").InIteration(n-1, "echo").String()
		var read, fold, next []time.Duration
		var events int
		for range 5 {
			t0 := time.Now()
			all, _, err := env.Store.Read(ctx, res.RunID)
			if err != nil {
				b.Fatal(err)
			}
			t1 := time.Now()
			st, err := engine.Fold(all[:cut(all, last)])
			if err != nil {
				b.Fatal(err)
			}
			t2 := time.Now()
			rs, ok := engine.Next(st.Workflow, st, time.Now()).(engine.RunStep)
			t3 := time.Now()
			if !ok || rs.Plan.StepID != last || !rs.Plan.Started {
				b.Fatalf("resume plans %#v", rs)
			}
			read, fold, next = append(read, t1.Sub(t0)), append(fold, t2.Sub(t1)), append(next, t3.Sub(t2))
			events = len(all)
		}
		ms := func(ds []time.Duration) float64 { return float64(palbench.Median(ds).Microseconds()) / 1e3 }
		b.ReportMetric(float64(events), "events")
		b.ReportMetric(ms(read), "ms/read")
		b.ReportMetric(ms(fold), "ms/fold")
		b.ReportMetric(ms(next), "ms/next")
		total := make([]time.Duration, len(read))
		for i := range read {
			total[i] = read[i] + fold[i] + next[i]
		}
		b.ReportMetric(ms(total), "ms/resume")
		// A run cut there, as a crash leaves it: the journal up to the
		// last iteration's step_started, copied to a run of its own.
		full := all(ctx, b, env.Store, res.RunID)
		cutID := copyRun(ctx, b, env.Store, full[:cut(full, last)])
		b.ReportMetric(resumeFromSnapshot(ctx, b, env.Store, cutID, last, 0), "ms/resume-snapshot-at-head")
		b.ReportMetric(resumeFromSnapshot(ctx, b, env.Store, cutID, last, workers.SnapshotInterval(len(full))), "ms/resume-snapshot-behind")
	}
}

func all(ctx context.Context, b *testing.B, store *eventstore.Store, runID string) []event.Event {
	evs, _, err := store.Read(ctx, runID)
	if err != nil {
		b.Fatal(err)
	}
	return evs
}

// copyRun appends evs to the journal of a new run, chained under its id,
// and returns the id.
func copyRun(ctx context.Context, b *testing.B, store *eventstore.Store, evs []event.Event) string {
	runID := event.NewRunID()
	var head eventstore.Head
	for len(evs) > 0 {
		n := min(len(evs), 1000)
		var err error
		if head, err = store.Append(ctx, runID, head, slices.Clone(evs[:n])...); err != nil {
			b.Fatal(err)
		}
		evs = evs[n:]
	}
	return runID
}

// resumeFromSnapshot is the resume of run runID (cut mid-way in its last
// step, last) on a worker that has not seen the run, from the snapshot a
// worker writes of it (snapshot.go), behind events before the journal's
// end: 0 as at a park, SnapshotInterval as at worst after a crash. It
// returns the median time of what the drive does: the snapshot's read,
// decode and check, with the read of the journal after it, the fold of
// that tail, the drive's read from there (nothing new), and the first Next.
func resumeFromSnapshot(ctx context.Context, b *testing.B, store *eventstore.Store, runID, last string, behind int) float64 {
	evs := all(ctx, b, store, runID)
	at := len(evs)
	// The head of the message holding event at-behind.
	var head eventstore.Head
	err := store.Scan(ctx, runID, 0, 0, func(streamSeq uint64, body []byte) {
		mevs, err := event.Decode(body)
		if err == nil && len(mevs) > 0 && mevs[len(mevs)-1].Seq <= uint64(at-behind) {
			head = eventstore.Head{Seq: mevs[len(mevs)-1].Seq, StreamSeq: streamSeq, Hash: event.Hash(body)}
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	st, err := engine.Fold(evs[:head.Seq])
	if err != nil {
		b.Fatal(err)
	}
	head.Driver = st.LastWorker
	// A drive's state has met Next at every step, as this one now has.
	engine.Next(st.Workflow, st, time.Now())
	snap, err := workers.EncodeSnapshot(st, head)
	if err != nil {
		b.Fatal(err)
	}
	if err := store.PutSnapshot(ctx, runID, snap); err != nil {
		b.Fatal(err)
	}
	var took []time.Duration
	for range 5 {
		t0 := time.Now()
		st, head, err := workers.ResumeSnapshot(ctx, store, runID)
		if err != nil {
			b.Fatal(err)
		}
		if tail, _, err := store.ReadAfter(ctx, runID, head); err != nil || len(tail) > 0 {
			b.Fatalf("%d events after the resumed head (%v)", len(tail), err)
		}
		rs, ok := engine.Next(st.Workflow, st, time.Now()).(engine.RunStep)
		took = append(took, time.Since(t0))
		if !ok || rs.Plan.StepID != last || !rs.Plan.Started || st.LastSeq != uint64(at) {
			b.Fatalf("resume from a snapshot at seq %d plans %#v", st.LastSeq, rs)
		}
	}
	b.ReportMetric(float64(len(snap))/(1<<20), "MiB/snapshot")
	if behind > 0 {
		b.ReportMetric(float64(uint64(at)-head.Seq), "events/tail-behind")
	}
	return float64(palbench.Median(took).Microseconds()) / 1e3
}

// cut is the length of the journal evs before stepID's completion.
func cut(evs []event.Event, stepID string) int {
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].Kind == event.StepCompleted && evs[i].StepID == stepID {
			return i
		}
	}
	return len(evs)
}

// waitRunEnd watches run runID until it ends, which must be a success,
// and returns its journal.
func waitRunEnd(ctx context.Context, tb testing.TB, env *palbench.Env, runID string) []event.Event {
	tb.Helper()
	var evs []event.Event
	err := env.Store.Watch(ctx, runID, eventstore.Head{}, func(ev event.Event) error {
		evs = append(evs, ev)
		if ev.Kind.Terminal() {
			return eventstore.ErrStopWatch
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	if k := evs[len(evs)-1].Kind; k != event.RunSucceeded {
		tb.Fatalf("run %s ended with %s", runID, k)
	}
	return evs
}
