package palbench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/provider"
	"github.com/palrun/pal/provider/providertest"
	"github.com/palrun/pal/runs"
)

// EconomicsOptions configure the economics benchmark.
type EconomicsOptions struct {
	// Worker is the pal binary whose `pal worker` processes drive the run.
	Worker string
	// Steps is the length of the LLM workflow (default 20).
	Steps int
	// KillAt lists the steps during whose model call the worker is killed
	// with SIGKILL (default 5, 10, 15).
	KillAt []int
	// Model is priced from the price table (default gpt-4o).
	Model string
}

func (o EconomicsOptions) withDefaults() EconomicsOptions {
	if o.Steps == 0 {
		o.Steps = 20
	}
	if o.KillAt == nil {
		o.KillAt = []int{5, 10, 15}
	}
	if o.Model == "" {
		o.Model = "gpt-4o"
	}
	return o
}

// Tokens of step i (from 1) of the economics workflow: an agent-like run
// whose context grows by the previous answers.
func economicsTokens(i int) provider.Usage {
	return provider.Usage{InputTokens: int64(1000 + 500*(i-1)), OutputTokens: 300}
}

// EconomicsResult is what a crash costs, in dollars at list price, with
// PAL and with a restart from scratch.
type EconomicsResult struct {
	Model                string
	InputPrice, OutPrice float64 // USD per million tokens
	Steps                int
	KillAt               []int
	Workers              int // worker processes started (one per kill, plus the first)
	CleanCost            float64
	Calls                int // requests PAL sent to the provider
	ChargedCalls         int // requests the provider did work for (one per idempotency key)
	DedupedCalls         int // repeated keys, answered from the provider's record
	ReSpent              float64
	ReSpentWithoutDedup  float64 // what the repeated calls would cost a provider that ignores keys
	ScratchCalls         int
	ScratchReSpent       float64
	JournalCost          float64 // cost_usd summed over the run's step_completed events
	Elapsed              time.Duration
}

// Economics runs an o.Steps-step LLM workflow on the fake provider (which
// honours idempotency keys) with real `pal worker` processes, kills the
// worker with SIGKILL during the model call of each step in o.KillAt, and
// starts another. The provider charges a call once per key: the first
// answer for a key is work done (and paid), a repeat gets the recorded
// answer. PAL's re-spend is what the provider charged beyond one clean
// run; a restart from scratch at each kill re-runs every step up to and
// including the one in flight.
func Economics(ctx context.Context, o EconomicsOptions) (EconomicsResult, error) {
	o = o.withDefaults()
	in, out, ok := provider.PriceOf(o.Model)
	if !ok {
		return EconomicsResult{}, fmt.Errorf("bench: model %q is not in the price table", o.Model)
	}
	res := EconomicsResult{Model: o.Model, InputPrice: in, OutPrice: out, Steps: o.Steps, KillAt: o.KillAt}
	cost := func(i int) float64 { return provider.Cost(o.Model, economicsTokens(i)) }
	for i := 1; i <= o.Steps; i++ {
		res.CleanCost += cost(i)
	}
	for _, k := range o.KillAt {
		if k < 1 || k > o.Steps {
			return res, fmt.Errorf("bench: cannot kill at step %d of %d", k, o.Steps)
		}
		res.ScratchCalls += k
		for i := 1; i <= k; i++ {
			res.ScratchReSpent += cost(i)
		}
	}
	res.ScratchCalls += o.Steps

	dir, err := os.MkdirTemp("", "pal-bench-economics-*")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	srv, err := startServer(dir, false)
	if err != nil {
		return res, err
	}
	defer func() { srv.Shutdown(); srv.WaitForShutdown() }()
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		return res, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return res, err
	}
	// A one-second lease: a killed worker's run is taken over a second later.
	if err := eventstore.Setup(ctx, js, eventstore.Config{LeaseTTL: time.Second}); err != nil {
		return res, err
	}
	store, err := eventstore.Open(ctx, js)
	if err != nil {
		return res, err
	}
	fake, err := providertest.Start("127.0.0.1:0")
	if err != nil {
		return res, err
	}
	defer fake.Close()
	fake.Dedup(true)

	runID := event.NewRunID()
	stepOf := map[string]int{}
	for i := 1; i <= o.Steps; i++ {
		stepOf[event.IdempotencyKey(runID, fmt.Sprintf("s%d", i), 1)] = i
	}
	fleet := &workerFleet{bin: o.Worker, env: workerEnv(srv.ClientURL(), fake)}
	var killMu sync.Mutex
	killAt := map[int]bool{}
	for _, k := range o.KillAt {
		killAt[k] = true
	}
	fake.SetResponder(func(c providertest.Call) providertest.Reply {
		i := stepOf[c.IdempotencyKey]
		killMu.Lock()
		if killAt[i] {
			// The provider does the work (and charges for it); the worker
			// dies before it hears the answer.
			delete(killAt, i)
			fleet.kill()
		}
		killMu.Unlock()
		u := economicsTokens(i)
		return providertest.Reply{Text: fmt.Sprintf("answer %d", i), InputTokens: u.InputTokens, OutputTokens: u.OutputTokens}
	})

	start := time.Now()
	if err := fleet.start(); err != nil {
		return res, err
	}
	defer fleet.stop()
	if _, err := runs.New(store).Start(ctx, runs.StartCommand{RunID: runID, Workflow: economicsWorkflow(o.Steps, o.Model), By: "bench", Rights: runs.AllRights}); err != nil {
		return res, err
	}
	evs, err := fleet.until(ctx, store, runID)
	if err != nil {
		return res, err
	}
	res.Elapsed = time.Since(start)
	res.Workers = fleet.started
	if last := evs[len(evs)-1]; last.Kind != event.RunSucceeded {
		return res, fmt.Errorf("bench: run %s ended with %s", runID, last.Kind)
	}
	for _, ev := range evs {
		if ev.Kind != event.StepCompleted {
			continue
		}
		var d event.StepCompletedData
		if err := ev.DecodeData(&d); err == nil && d.Usage != nil {
			res.JournalCost += d.Usage.CostUSD
		}
	}
	charged := 0.0
	for key, n := range fake.Keys() {
		i, ok := stepOf[key]
		if !ok {
			return res, fmt.Errorf("bench: the provider saw key %s, of no step of the run", key)
		}
		res.Calls += n
		res.ChargedCalls++
		charged += cost(i)
		res.DedupedCalls += n - 1
		res.ReSpentWithoutDedup += float64(n-1) * cost(i)
	}
	// Sums in map order differ in the last bits: what is within a
	// nano-dollar of nothing is nothing (and never prints as -0).
	if res.ReSpent = charged - res.CleanCost; math.Abs(res.ReSpent) < 1e-9 {
		res.ReSpent = 0
	}
	killMu.Lock()
	defer killMu.Unlock()
	if len(killAt) > 0 {
		return res, fmt.Errorf("bench: the run never reached steps %v", slices.Sorted(maps.Keys(killAt)))
	}
	return res, nil
}

// economicsWorkflow is a chain of n ai-steps on model, each quoting the
// previous answer.
func economicsWorkflow(n int, model string) json.RawMessage {
	return chain(fmt.Sprintf("economics-%d", n), n, func(i int, prev string) (string, json.RawMessage) {
		prompt := "begin"
		if i > 1 {
			prompt = fmt.Sprintf("go on from: {{steps.%s.output.text}}", prev)
		}
		data, _ := json.Marshal(map[string]string{"provider": "openai", "model": model, "prompt": prompt})
		return "ai-step", data
	})
}

// workerEnv is the environment of the bench's worker processes: this
// process's, without PAL, provider or database settings (PAL_PRICES
// excepted: the workers price as the bench does), pointed at the bench's
// server and fake provider.
func workerEnv(natsURL string, fake *providertest.Server) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PAL_PRICES=") || !(strings.HasPrefix(kv, "PAL_") || strings.HasPrefix(kv, "OPENAI_") ||
			strings.HasPrefix(kv, "ANTHROPIC_") || strings.HasPrefix(kv, "DATABASE_URL=")) {
			env = append(env, kv)
		}
	}
	return append(env, "PAL_NATS_URL="+natsURL, "PAL_LEASE_TTL=1s", "PAL_LOG_LEVEL=error",
		"OPENAI_BASE_URL="+fake.OpenAIBaseURL(), "OPENAI_API_KEY=test")
}

// workerFleet runs one `pal worker` process at a time: kill ends it with
// SIGKILL, and until starts the next.
type workerFleet struct {
	bin     string
	env     []string
	mu      sync.Mutex
	cur     *exec.Cmd
	exited  chan struct{}
	started int
}

func (f *workerFleet) start() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.started++
	cmd := exec.Command(f.bin, "worker")
	cmd.Env = append(f.env, fmt.Sprintf("PAL_WORKER_ID=bench-%d", f.started))
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("bench: starting %s worker: %w", f.bin, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	f.cur, f.exited = cmd, done
	return nil
}

func (f *workerFleet) kill() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cur != nil {
		_ = f.cur.Process.Signal(syscall.SIGKILL)
	}
}

func (f *workerFleet) stop() {
	f.kill()
	f.mu.Lock()
	done := f.exited
	f.mu.Unlock()
	if done != nil {
		<-done
	}
}

// until waits for the run to end, starting a new worker each time the
// current one dies, and returns the run's journal.
func (f *workerFleet) until(ctx context.Context, store *eventstore.Store, runID string) ([]event.Event, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		f.mu.Lock()
		exited := f.exited
		f.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("bench: run %s did not end: %w", runID, ctx.Err())
		case <-exited:
			if err := f.start(); err != nil {
				return nil, err
			}
		case <-tick.C:
			evs, _, err := store.Read(ctx, runID)
			if err != nil && !errors.Is(err, eventstore.ErrRunNotFound) {
				return nil, err
			}
			if len(evs) > 0 && evs[len(evs)-1].Kind.Terminal() {
				return evs, nil
			}
		}
	}
}
