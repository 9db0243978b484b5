// Package palbench measures PAL's per-step overhead and throughput: a worker
// drives runs of no-op tool steps against a real JetStream server (embedded,
// reached over loopback TCP unless told otherwise), and the journal's own
// timestamps give the per-step latency. pal bench and the go test
// benchmarks in package workers both use it.
//
// Invariant: nothing is stubbed between the worker and the journal, so a
// number measured here is what a run pays per step in the durability mode
// asked for (docs/architecture.md §12).
package palbench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/internal/service"
	"github.com/palrun/pal/runs"
	"github.com/palrun/pal/workers"
)

// Options configure a benchmark environment.
type Options struct {
	// Strict turns on fsync-before-ack (SyncAlways) and event packing.
	Strict bool
	// InProcess connects the worker to the server in-process instead of
	// over loopback TCP.
	InProcess bool
	// Dir is where JetStream stores data (a temp dir when empty).
	Dir string
	// Connect, when set, connects to a server of the caller's (a cluster)
	// instead of starting one; it is called twice (the worker's connection
	// and the watcher's). Strict and InProcess then do not apply.
	Connect func() (*nats.Conn, error)
	// Replicas is the streams' replica count (3 on a cluster).
	Replicas int
	// Concurrency is the worker's concurrency (default 64).
	Concurrency int
	// RunConcurrency caps the steps of one run in flight (default the
	// worker's, workers.DefaultRunConcurrency).
	RunConcurrency int
	// Logger receives worker logs (discarded when nil).
	Logger *slog.Logger
}

// Env is a running benchmark environment: a JetStream server and a worker.
type Env struct {
	Store *eventstore.Store
	// client starts the runs.
	client *runs.Client
	subNC  *nats.Conn
	// parts are what Start started, stopped in reverse by Close.
	parts service.Stack
}

// Start brings up the server and a worker with an "echo" tool. When it
// fails, what it started is stopped again.
func Start(ctx context.Context, o Options) (_ *Env, err error) {
	e := &Env{}
	defer func() {
		if err != nil {
			e.Close()
		}
	}()
	dir := o.Dir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "pal-bench-*"); err != nil {
			return nil, err
		}
		e.parts.Started("the temporary store "+dir, func(context.Context) error { return os.RemoveAll(dir) })
	}
	connect := o.Connect
	var srv *server.Server
	if connect == nil {
		if srv, err = startServer(dir, o.Strict); err != nil {
			return nil, err
		}
		e.parts.Started("the NATS server", service.Closer(func() {
			srv.Shutdown()
			srv.WaitForShutdown()
		}))
		connect = func() (*nats.Conn, error) { return nats.Connect(srv.ClientURL()) }
	}
	var nc *nats.Conn
	if o.InProcess && srv != nil {
		nc, err = nats.Connect("", nats.InProcessServer(srv))
	} else {
		nc, err = connect()
	}
	if err != nil {
		return nil, err
	}
	e.parts.Started("the worker's NATS connection", service.Closer(nc.Close))
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	if err := eventstore.Setup(ctx, js, eventstore.Config{Replicas: o.Replicas}); err != nil {
		return nil, err
	}
	if e.Store, err = eventstore.Open(ctx, js, eventstore.WithPacking(o.Strict)); err != nil {
		return nil, err
	}
	leases, err := eventstore.OpenLeases(ctx, js, eventstore.DefaultLeaseTTL)
	if err != nil {
		return nil, err
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	w := workers.New(workers.Config{ID: "bench", Concurrency: o.Concurrency, RunConcurrency: o.RunConcurrency, Logger: log},
		e.Store, leases, nil, nil)
	if err := e.parts.Start(ctx, "the worker", w); err != nil {
		return nil, err
	}
	if e.subNC, err = connect(); err != nil {
		return nil, err
	}
	e.parts.Started("the watcher's NATS connection", service.Closer(e.subNC.Close))
	e.client = runs.New(e.Store)
	return e, nil
}

// startServer starts an embedded JetStream server on a free loopback port,
// storing in dir; strict syncs every write.
func startServer(dir string, strict bool) (*server.Server, error) {
	opts := &server.Options{JetStream: true, StoreDir: dir, Host: "127.0.0.1", Port: -1, NoSigs: true,
		NoLog: true, SyncAlways: strict, JetStreamMaxMemory: 256 << 20}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, err
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		return nil, fmt.Errorf("bench: NATS server did not start")
	}
	return srv, nil
}

// Close stops what Start started, in reverse: the watcher's connection,
// the worker, its connection, the server, and removes a temporary store.
func (e *Env) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = e.parts.Stop(ctx)
}

// Workflow returns a sequential workflow of n echo tool steps.
func Workflow(n int) json.RawMessage {
	return chain(fmt.Sprintf("bench-%d", n), n, func(i int, _ string) (string, json.RawMessage) {
		return "tool", json.RawMessage(`{"tool":"echo","input":{"i":` + fmt.Sprint(i) + `}}`)
	})
}

// FanOutWorkflow returns a workflow of one loop over items items whose
// body is one echo tool step, concurrency iterations in flight at once
// (the run's policy.concurrency too): a fan-out of items steps.
func FanOutWorkflow(items, concurrency int) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"name":"bench-fan-out-%d","nodes":[{"id":"start","type":"trigger"},`+
		`{"id":"each","type":"loop","data":{"over":"{{input.items}}","maxIterations":%d,"concurrency":%d,`+
		`"body":{"name":"one","nodes":[{"id":"start","type":"trigger"},{"id":"echo","type":"tool","data":{"tool":"echo","input":{"i":"{{input.index}}"}}}],`+
		`"edges":[{"from":"start","to":"echo"}]}}}],"edges":[{"from":"start","to":"each"}],"policy":{"concurrency":%d}}`,
		items, max(items, 1), concurrency, concurrency))
}

// FanOut runs one fan-out of items echo steps with concurrency in flight
// at once (FanOutWorkflow) and waits for it to end; it must succeed. The
// Result is one run of items steps: StepsPerSecond compares with Runs'.
func (e *Env) FanOut(ctx context.Context, items, concurrency int) (Result, error) {
	in, err := json.Marshal(map[string]any{"items": make([]int, items)})
	if err != nil {
		return Result{}, err
	}
	done := make(chan event.Kind, 1)
	id := event.NewRunID()
	stop, err := e.onEnd(eventstore.WatchPrefix, func(runID string, end event.Kind) {
		if runID == id {
			done <- end
		}
	})
	if err != nil {
		return Result{}, err
	}
	defer stop()
	start := time.Now()
	if _, err := e.client.Start(ctx, runs.StartCommand{RunID: id, Workflow: FanOutWorkflow(items, concurrency), Input: in, By: "bench", Rights: runs.AllRights}); err != nil {
		return Result{}, err
	}
	select {
	case end := <-done:
		if end != event.RunSucceeded {
			return Result{}, fmt.Errorf("bench: fan-out run %s ended with %s", id, end)
		}
	case <-ctx.Done():
		return Result{}, fmt.Errorf("bench: fan-out run %s has not ended: %w", id, ctx.Err())
	}
	return Result{Runs: 1, StepsPerRun: items, Elapsed: time.Since(start)}, nil
}

// chain is a workflow of n nodes s1…sn after the trigger, one after
// another; node gives the type and data of node i, whose predecessor is
// prev.
func chain(name string, n int, node func(i int, prev string) (typ string, data json.RawMessage)) json.RawMessage {
	type jsonNode struct {
		ID   string          `json:"id"`
		Type string          `json:"type"`
		Data json.RawMessage `json:"data,omitempty"`
	}
	type edge struct {
		From string `json:"from"`
		To   string `json:"to"`
	}
	wf := struct {
		Name  string     `json:"name"`
		Nodes []jsonNode `json:"nodes"`
		Edges []edge     `json:"edges"`
	}{Name: name}
	wf.Nodes = append(wf.Nodes, jsonNode{ID: "start", Type: "trigger"})
	prev := "start"
	for i := 1; i <= n; i++ {
		id := fmt.Sprintf("s%d", i)
		typ, data := node(i, prev)
		wf.Nodes = append(wf.Nodes, jsonNode{ID: id, Type: typ, Data: data})
		wf.Edges = append(wf.Edges, edge{From: prev, To: id})
		prev = id
	}
	b, _ := json.Marshal(wf)
	return b
}

// Result is one measurement.
type Result struct {
	Runs, StepsPerRun int
	Elapsed           time.Duration
	// StepLatencies are the gaps between consecutive step_completed events
	// of each run: the wall time of one step, journal included.
	StepLatencies []time.Duration
}

// StepsPerSecond is the throughput over the whole measurement.
func (r Result) StepsPerSecond() float64 {
	return float64(r.Runs*r.StepsPerRun) / r.Elapsed.Seconds()
}

// Percentile returns the q-quantile (0..1) of the step latencies.
func (r Result) Percentile(q float64) time.Duration {
	if len(r.StepLatencies) == 0 {
		return 0
	}
	s := slices.Clone(r.StepLatencies)
	slices.Sort(s)
	i := int(q * float64(len(s)-1))
	return s[i]
}

// Runs starts `runs` runs of a steps-long sequential workflow at once and
// waits for all of them to end; every run must succeed.
func (e *Env) Runs(ctx context.Context, n, steps int) (Result, error) {
	wf := Workflow(steps)
	done := make(chan string, n)
	stop, err := e.onEnd(eventstore.EventsPrefix, func(runID string, _ event.Kind) { done <- runID })
	if err != nil {
		return Result{}, err
	}
	defer stop()
	start := time.Now()
	ids := make([]string, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := e.client.Start(ctx, runs.StartCommand{Workflow: wf, By: "bench", Rights: runs.AllRights})
			if err != nil {
				errs <- err
				return
			}
			ids[i] = res.RunID
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return Result{}, err
	}
	for ended := range n {
		select {
		case <-done:
		case <-ctx.Done():
			return Result{}, fmt.Errorf("bench: %d of %d runs ended before %v", ended, n, ctx.Err())
		}
	}
	res := Result{Runs: n, StepsPerRun: steps, Elapsed: time.Since(start)}
	for _, id := range ids {
		// A core subscriber can see a message before the stream has stored
		// it (in strict mode, before the fsync): read until the end shows.
		var evs []event.Event
		for {
			var err error
			if evs, _, err = e.Store.Read(ctx, id); err != nil {
				return res, err
			}
			if evs[len(evs)-1].Kind.Terminal() {
				break
			}
			select {
			case <-ctx.Done():
				return res, fmt.Errorf("bench: run %s has not ended: %w", id, ctx.Err())
			case <-time.After(time.Millisecond):
			}
		}
		last := evs[len(evs)-1]
		if last.Kind != event.RunSucceeded {
			return res, fmt.Errorf("bench: run %s ended with %s", id, last.Kind)
		}
		var prev time.Time
		for _, ev := range evs {
			if ev.Kind != event.StepCompleted {
				continue
			}
			if !prev.IsZero() {
				res.StepLatencies = append(res.StepLatencies, ev.TS.Sub(prev))
			}
			prev = ev.TS
		}
	}
	return res, nil
}

// Latencies starts n runs of a steps-long sequential workflow one after
// another and returns, for each, the wall time from the start command to
// the moment a watching client sees its terminal event (Store.Watch, as
// pal run watch and the event feeds do): what one workflow costs end to
// end, start and notification included. With named, the workflow is
// deployed first and each run starts it by name, as a client of a
// deployed workflow does; otherwise each start brings the definition.
func (e *Env) Latencies(ctx context.Context, n, steps int, named bool) ([]time.Duration, error) {
	wf := Workflow(steps)
	if named {
		d, err := e.client.Deploy(ctx, runs.DeployCommand{Workflow: wf, By: "bench", Rights: runs.AllRights})
		if err != nil {
			return nil, err
		}
		if wf, err = json.Marshal(d.Name); err != nil {
			return nil, err
		}
	}
	out := make([]time.Duration, 0, n)
	for range n {
		t0 := time.Now()
		res, err := e.client.Start(ctx, runs.StartCommand{Workflow: wf, By: "bench", Rights: runs.AllRights})
		if err != nil {
			return out, err
		}
		var last event.Event
		err = e.Store.Watch(ctx, res.RunID, eventstore.Head{}, func(ev event.Event) error {
			if ev.Kind.Terminal() {
				last = ev
				return eventstore.ErrStopWatch
			}
			return nil
		})
		if err != nil {
			return out, err
		}
		out = append(out, time.Since(t0))
		if last.Kind != event.RunSucceeded {
			return out, fmt.Errorf("bench: run %s ended with %s", res.RunID, last.Kind)
		}
	}
	return out, nil
}

// Median is the middle of ds (which it sorts).
func Median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// Sustain keeps n runs of a steps-long sequential workflow in flight: each
// run that ends is replaced by a new one at once. After warm (not
// counted), it counts the runs that end within window; the Result's Runs
// is that count and Elapsed the window, so StepsPerSecond is the steady
// throughput with n in flight, free of a burst's ramp-up and drain. Every
// run must succeed. A run counts as ended when the stream republishes its
// terminal event (pal.watch.<run_id>), which is after the stream stored
// it, as a watching client sees it.
func (e *Env) Sustain(ctx context.Context, n, steps int, warm, window time.Duration) (Result, error) {
	start := time.Now()
	from, to := start.Add(warm), start.Add(warm+window)
	var counted atomic.Int64
	err := e.keep(ctx, n, steps, func() bool { return time.Now().Before(to) }, func() {
		if now := time.Now(); now.After(from) && !now.After(to) {
			counted.Add(1)
		}
	})
	return Result{Runs: int(counted.Load()), StepsPerRun: steps, Elapsed: window}, err
}

// Burst runs total runs of a steps-long sequential workflow, n in flight
// at once (each run that ends is replaced until total have started), and
// waits for the last to end; every run must succeed.
func (e *Env) Burst(ctx context.Context, total, n, steps int) (Result, error) {
	start := time.Now()
	var started atomic.Int64
	err := e.keep(ctx, min(n, total), steps, func() bool { return started.Add(1) <= int64(total) }, func() {})
	return Result{Runs: total, StepsPerRun: steps, Elapsed: time.Since(start)}, err
}

// keep runs n loops, each starting a run while more says so and waiting
// for it to end (ended is called for each); every run must succeed.
func (e *Env) keep(ctx context.Context, n, steps int, more func() bool, ended func()) error {
	wf := Workflow(steps)
	var (
		mu      sync.Mutex
		waiting = make(map[string]chan event.Kind, n)
	)
	stop, err := e.onEnd(eventstore.WatchPrefix, func(runID string, end event.Kind) {
		mu.Lock()
		ch := waiting[runID]
		mu.Unlock()
		if ch != nil {
			ch <- end
		}
	})
	if err != nil {
		return err
	}
	defer stop()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Go(func() {
			for more() {
				id := event.NewRunID()
				ch := make(chan event.Kind, 1)
				mu.Lock()
				waiting[id] = ch
				mu.Unlock()
				_, err := e.client.Start(ctx, runs.StartCommand{RunID: id, Workflow: wf, By: "bench", Rights: runs.AllRights})
				if err == nil {
					select {
					case end := <-ch:
						if end != event.RunSucceeded {
							err = fmt.Errorf("bench: run %s ended with %s", id, end)
						}
					case <-ctx.Done():
						err = fmt.Errorf("bench: run %s has not ended: %w", id, ctx.Err())
					}
				}
				mu.Lock()
				delete(waiting, id)
				mu.Unlock()
				if err != nil {
					errs <- err
					return
				}
				ended()
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// Memory is what the process holds: its resident set (VmRSS), split into
// anonymous memory (RssAnon: the Go heap, stacks, the runtime's own) and
// pages of files (RssFile: the binary's code and data as far as it was
// touched), and the Go heap in use after a collection and what the
// runtime holds from the OS for it.
type Memory struct {
	RSS, RSSAnon, RSSFile uint64
	HeapInuse, HeapSys    uint64
}

// MeasureMemory collects garbage and reads the process's memory; with
// profile set it also writes the heap profile there (go tool pprof
// -sample_index=inuse_space says where the bytes are).
func MeasureMemory(profile string) (Memory, error) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	m := Memory{HeapInuse: ms.HeapInuse, HeapSys: ms.HeapSys - ms.HeapReleased}
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return m, fmt.Errorf("bench: reading the resident set: %w", err)
	}
	fields := map[string]*uint64{"VmRSS:": &m.RSS, "RssAnon:": &m.RSSAnon, "RssFile:": &m.RSSFile}
	for line := range strings.SplitSeq(string(status), "\n") {
		name, rest, _ := strings.Cut(line, "\t")
		if dst := fields[name]; dst != nil {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				return m, fmt.Errorf("bench: reading the resident set: %q: %w", line, err)
			}
			*dst = kb << 10
		}
	}
	if profile != "" {
		f, err := os.Create(profile)
		if err != nil {
			return m, err
		}
		if err := pprof.WriteHeapProfile(f); err != nil {
			f.Close()
			return m, err
		}
		return m, f.Close()
	}
	return m, nil
}

// onEnd calls fn with the run id and kind of every terminal event on
// prefix+<run_id> (pal.events., as published, or pal.watch., as stored)
// until the returned stop.
func (e *Env) onEnd(prefix string, fn func(runID string, end event.Kind)) (stop func(), err error) {
	sub, err := e.subNC.Subscribe(prefix+"*", func(m *nats.Msg) {
		// A packed message lists its kinds; a terminal event is the last.
		kinds := m.Header.Get("Pal-Kind")
		end := event.Kind(kinds[strings.LastIndexByte(kinds, ',')+1:])
		if end.Terminal() {
			fn(strings.TrimPrefix(m.Subject, prefix), end)
		}
	})
	if err != nil {
		return nil, err
	}
	if err := e.subNC.Flush(); err != nil {
		_ = sub.Unsubscribe()
		return nil, err
	}
	return func() { _ = sub.Unsubscribe() }, nil
}
