package projections_test

// Benchmarks (go test -run '^$' -bench . -benchtime 1x ./projections/):
//
//   - BenchmarkProjectorThroughput fills PAL_EVENTS with about 200 000
//     events (2 000 runs of 49 tool steps, appended by 64 goroutines, so 64
//     runs are active at a time as with one worker of default
//     concurrency), then times a projector from an empty database until it
//     has committed the last message: events/s.
//   - BenchmarkRebuild replays the same stream with Rebuild.
//   - BenchmarkProjectorLag appends 2 000 events/s for 10 s across 20
//     active runs and measures, per event, the time from Append returning
//     (JetStream has stored it) to the NOTIFY of the batch that commits it
//     (LISTEN pal_projections on its own connection): p50, p99, max.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/paltest/testenv"
	"github.com/palrun/pal/projections"
)

// synthRun appends the journal of a run of tool steps, one event at a time.
type synthRun struct {
	id    string
	head  eventstore.Head
	n     int // events appended
	steps int // 0: never ends
}

var (
	synthWF   = json.RawMessage(echoChain(49))
	synthHash = func() string { s := sha256.Sum256(synthWF); return hex.EncodeToString(s[:]) }()
)

func (r *synthRun) done() bool { return r.steps > 0 && r.n == 2*r.steps+3 }

func (r *synthRun) next() event.Event {
	n := r.n
	r.n++
	m := event.MustNew
	var e event.Event
	switch {
	case n == 0:
		e = m(event.RunCreated, "", 0, event.RunCreatedData{Workflow: synthWF, WorkflowHash: synthHash,
			WorkflowName: "echo-49", Input: json.RawMessage(`{"v":"bench"}`)})
	case n == 1:
		e = m(event.RunResumed, "", 0, event.RunResumedData{Worker: "bench", ResumeCount: 1})
	case r.steps > 0 && n == 2*r.steps+2:
		e = m(event.RunSucceeded, "", 0, event.RunSucceededData{Output: json.RawMessage(`{"i":49,"v":"bench"}`)})
	default:
		k := (n-2)/2 + 1
		step := "t" + strconv.Itoa(k)
		in := json.RawMessage(fmt.Sprintf(`{"i":%d,"v":"bench"}`, k))
		if n%2 == 0 {
			e = m(event.StepStarted, step, 1, event.StepStartedData{NodeID: step, NodeType: "tool", Input: in,
				IdempotencyKey: event.IdempotencyKey(r.id, step, 1)})
		} else {
			e = m(event.StepCompleted, step, 1, event.StepCompletedData{Output: in, DurationMs: 1})
		}
	}
	e.WorkerID = "bench"
	return e
}

func (r *synthRun) append(ctx context.Context, store *eventstore.Store) (eventstore.Head, error) {
	h, err := store.Append(ctx, r.id, r.head, r.next())
	if err != nil {
		return h, err
	}
	r.head = h
	return h, nil
}

type benchEnv struct {
	nats  *testenv.NATSServer
	js    jetstream.JetStream
	store *eventstore.Store
}

func newBenchEnv(b *testing.B) *benchEnv {
	b.Helper()
	e := &benchEnv{nats: testenv.NATS(b)}
	nc := e.nats.Conn(b)
	var err error
	if e.js, err = jetstream.New(nc); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if err := eventstore.Setup(ctx, e.js, eventstore.Config{}); err != nil {
		b.Fatal(err)
	}
	if e.store, err = eventstore.Open(ctx, e.js); err != nil {
		b.Fatal(err)
	}
	return e
}

func freshDB(b *testing.B) *testenv.PG {
	b.Helper()
	pg := testenv.Postgres(b)
	if _, err := projections.Migrate(context.Background(), pg.Pool(b)); err != nil {
		b.Fatal(err)
	}
	return pg
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// fill appends runs runs of steps tool steps, from writers goroutines, and
// returns the stream's last sequence.
func (e *benchEnv) fill(b *testing.B, runs, steps, writers int) uint64 {
	b.Helper()
	ctx := context.Background()
	fillStart := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < runs; i += writers {
				r := &synthRun{id: event.NewRunID(), steps: steps}
				for !r.done() {
					if _, err := r.append(ctx, e.store); err != nil {
						errs <- err
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	last, err := streamLast(ctx, e.js)
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("filled PAL_EVENTS with %d events in %s", last, time.Since(fillStart).Round(time.Millisecond))
	return last
}

func BenchmarkProjectorThroughput(b *testing.B) {
	e := newBenchEnv(b)
	ctx := context.Background()
	last := e.fill(b, 2000, 49, 64)

	var total time.Duration
	var batches uint64
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		pool := freshDB(b).Pool(b)
		p := projections.New(pool, e.store, projections.Config{Logger: quiet})
		b.StartTimer()
		start := time.Now()
		if err := p.Start(ctx); err != nil {
			b.Fatal(err)
		}
		if err := p.WaitFor(ctx, last); err != nil {
			b.Fatal(err)
		}
		total += time.Since(start)
		b.StopTimer()
		batches += p.Stats().Batches
		if err := p.Stop(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(last)*float64(b.N)/total.Seconds(), "events/s")
	b.ReportMetric(float64(last)*float64(b.N)/float64(batches), "events/batch")
}

// BenchmarkRebuild replays the same 200 000 events as
// BenchmarkProjectorThroughput with Rebuild: events/s.
func BenchmarkRebuild(b *testing.B) {
	e := newBenchEnv(b)
	ctx := context.Background()
	last := e.fill(b, 2000, 49, 64)
	var total time.Duration
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		pool := freshDB(b).Pool(b)
		b.StartTimer()
		start := time.Now()
		res, err := projections.Rebuild(ctx, pool, e.js, projections.RebuildOptions{Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		total += time.Since(start)
		if res.StreamSeq != last {
			b.Fatalf("rebuilt up to %d of %d", res.StreamSeq, last)
		}
	}
	b.ReportMetric(float64(last)*float64(b.N)/total.Seconds(), "events/s")
}

func BenchmarkProjectorLag(b *testing.B) {
	const (
		rate     = 2000 // events per second
		duration = 10 * time.Second
		active   = 20 // runs appended to in turn
	)
	e := newBenchEnv(b)
	ctx := context.Background()
	var p50s, p99s, maxs []float64
	for range b.N {
		pg := freshDB(b)
		pool := pg.Pool(b)
		p := projections.New(pool, e.store, projections.Config{Logger: quiet})
		if err := p.Start(ctx); err != nil {
			b.Fatal(err)
		}
		start, err := streamLast(ctx, e.js)
		if err != nil {
			b.Fatal(err)
		}
		if err := p.WaitFor(ctx, start); err != nil {
			b.Fatal(err)
		}

		// Listen for commits.
		conn, err := pgx.Connect(ctx, pg.DSN())
		if err != nil {
			b.Fatal(err)
		}
		if _, err := conn.Exec(ctx, "LISTEN "+projections.NotifyChannel); err != nil {
			b.Fatal(err)
		}
		type commit struct {
			seq uint64
			at  time.Time
		}
		var (
			mu      sync.Mutex
			commits []commit
			target  uint64 = math.MaxUint64
			reached        = make(chan struct{})
		)
		lctx, stopListening := context.WithCancel(ctx)
		listened := make(chan struct{})
		go func() {
			defer close(listened)
			for {
				n, err := conn.WaitForNotification(lctx)
				if err != nil {
					return
				}
				at := time.Now()
				seq, _ := strconv.ParseUint(n.Payload, 10, 64)
				mu.Lock()
				commits = append(commits, commit{seq, at})
				done := seq >= target
				mu.Unlock()
				if done {
					close(reached)
					return
				}
			}
		}()

		// Append at a steady rate.
		runs := make([]*synthRun, active)
		for i := range runs {
			runs[i] = &synthRun{id: event.NewRunID()}
		}
		type appended struct {
			seq uint64
			at  time.Time
		}
		var sent []appended
		b.ResetTimer()
		t0 := time.Now()
		for i := 0; ; i++ {
			due := t0.Add(time.Duration(i) * time.Second / rate)
			if due.Sub(t0) >= duration {
				break
			}
			if d := time.Until(due); d > 0 {
				time.Sleep(d)
			}
			h, err := runs[i%active].append(ctx, e.store)
			if err != nil {
				b.Fatal(err)
			}
			sent = append(sent, appended{h.StreamSeq, time.Now()})
		}
		achieved := float64(len(sent)) / time.Since(t0).Seconds()
		// Wait for the announcement of the commit of the last event.
		mu.Lock()
		target = sent[len(sent)-1].seq
		done := len(commits) > 0 && commits[len(commits)-1].seq >= target
		mu.Unlock()
		if !done {
			select {
			case <-reached:
			case <-time.After(30 * time.Second):
				b.Fatalf("no commit of stream seq %d announced", target)
			}
		}
		stopListening()
		<-listened
		_ = conn.Close(ctx)
		b.StopTimer()

		lags := make([]float64, 0, len(sent))
		for _, s := range sent {
			i := sort.Search(len(commits), func(i int) bool { return commits[i].seq >= s.seq })
			if i == len(commits) {
				b.Fatalf("no commit announced for stream seq %d", s.seq)
			}
			lags = append(lags, float64(commits[i].at.Sub(s.at).Microseconds())/1000)
		}
		slices.Sort(lags)
		pct := func(q float64) float64 { return lags[min(len(lags)-1, int(q*float64(len(lags))))] }
		p50s, p99s, maxs = append(p50s, pct(0.50)), append(p99s, pct(0.99)), append(maxs, lags[len(lags)-1])
		b.Logf("appended %d events at %.0f/s; %d commits (%.1f events each)", len(sent), achieved, len(commits),
			float64(len(sent))/float64(max(len(commits), 1)))
		if err := p.Stop(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(median(p50s), "lag-p50-ms")
	b.ReportMetric(median(p99s), "lag-p99-ms")
	b.ReportMetric(median(maxs), "lag-max-ms")
}

func median(xs []float64) float64 {
	slices.Sort(xs)
	return xs[len(xs)/2]
}

func streamLast(ctx context.Context, js jetstream.JetStream) (uint64, error) {
	s, err := js.Stream(ctx, eventstore.EventsStream)
	if err != nil {
		return 0, err
	}
	return s.CachedInfo().State.LastSeq, nil
}
