package palcli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/palrun/pal/cmd/pal/palbench"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/eventstore/natsauth"
	"github.com/palrun/pal/provider"
	"github.com/palrun/pal/workflow"
)

func (e *env) benchCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure per-step overhead and throughput",
		Long: `pal bench starts an embedded JetStream server (in a temp dir) and a
worker, and measures, for each durability mode:

  - per-step overhead: one sequential run of --steps no-op tool steps; the
    gap between consecutive step_completed events, p50 and p99;
  - throughput: --runs concurrent runs of --steps-per-run no-op steps,
    steps per second from the first start to the last run_succeeded;
    with --duration, --runs runs are kept in flight for that long instead
    (each run that ends is replaced at once, after a 1 s warm-up that is
    not counted): the steady throughput, free of a burst's ramp-up and
    drain.

The worker reaches the server over loopback TCP unless --in-process.

pal bench --fan-out 1000 adds, in each mode, one run whose steps run at
once: a loop over 1000 items with --fan-out-concurrency (64) iterations in
flight, its body one no-op tool step, measured on the same worker right
after the concurrent runs, and prints its steps per second beside theirs.

pal bench --cluster adds a row for a 3-node JetStream cluster (three
pal dev-nats-node processes on loopback, as pal dev --cluster 3 starts
them, every stream R3), in process durability: there replication, not
fsync, is what an ack waits for.

pal bench --durability process --burst 500 measures memory instead: on a
fresh server and worker, 500 runs of --steps-per-run no-op steps, --runs
of them in flight at once (each run that ends is replaced), then the
process's resident set and Go heap in use after a collection, the server
embedded in the same process as the worker (as pal dev runs them). One
durability mode at a time, since the resident set is the process's;
--heap-profile FILE also writes the heap profile (go tool pprof
-sample_index=inuse_space FILE says where the bytes are).

pal bench --economics measures what a crash costs instead: a 20-step LLM
workflow (gpt-4o, priced from the price table; PAL_PRICES overrides it) on
the fake provider, driven by real pal worker processes, the worker killed
with SIGKILL during the model call of steps 5, 10 and 15. It reports the
dollars PAL re-spends (completed steps are not called again; the step in
flight is re-sent with its idempotency key, which the fake provider
deduplicates) against a restart from scratch at each kill.`,
		Args: cobra.NoArgs,
		RunE: e.runBench,
	}
	f := cmd.Flags()
	f.String("durability", "both", "process, strict or both")
	f.Int("steps", 500, "steps of the sequential run")
	f.Int("runs", 64, "concurrent runs")
	f.Int("steps-per-run", 50, "steps of each concurrent run")
	f.Duration("duration", 0, "keep --runs runs in flight this long (steady throughput) instead of one burst")
	f.Bool("in-process", false, "connect the worker to NATS in-process")
	f.Bool("cluster", false, "also measure on a 3-node cluster (three pal dev-nats-node processes on loopback, R3)")
	f.Int("fan-out", 0, "also measure one run fanning out to this many steps (0: none; at most 10000)")
	f.Int("fan-out-concurrency", 64, "steps of the fan-out in flight at once (1 to 1000)")
	f.Int("burst", 0, "measure memory at the end of a burst of this many runs, --runs in flight (0: no; needs one --durability)")
	f.String("heap-profile", "", "with --burst, write the heap profile at the end of the burst to this file")
	f.Bool("economics", false, "measure the dollars a crash re-spends, with PAL and with a restart from scratch")
	f.String("model", "gpt-4o", "model the economics run is priced as")
	return cmd
}

func (e *env) runBench(cmd *cobra.Command, _ []string) error {
	ctx := cmd.Context()
	mode, _ := cmd.Flags().GetString("durability")
	steps, _ := cmd.Flags().GetInt("steps")
	runs, _ := cmd.Flags().GetInt("runs")
	spr, _ := cmd.Flags().GetInt("steps-per-run")
	inproc, _ := cmd.Flags().GetBool("in-process")
	cluster, _ := cmd.Flags().GetBool("cluster")
	sustain, _ := cmd.Flags().GetDuration("duration")
	fan, _ := cmd.Flags().GetInt("fan-out")
	fanConc, _ := cmd.Flags().GetInt("fan-out-concurrency")
	burst, _ := cmd.Flags().GetInt("burst")
	heapProfile, _ := cmd.Flags().GetString("heap-profile")
	if econ, _ := cmd.Flags().GetBool("economics"); econ {
		model, _ := cmd.Flags().GetString("model")
		return e.runEconomics(ctx, model)
	}
	var modes []string
	switch mode {
	case "both":
		modes = []string{DurabilityProcess, DurabilityStrict}
	case DurabilityProcess, DurabilityStrict:
		modes = []string{mode}
	default:
		return badInput("--durability %q: want process, strict or both", mode)
	}
	if steps < 2 || runs < 1 || spr < 1 {
		return badInput("--steps must be ≥ 2, --runs and --steps-per-run ≥ 1")
	}
	if sustain < 0 || sustain > time.Hour {
		return badInput("--duration=%s: want 0 (one burst) up to 1h", sustain)
	}
	if fan < 0 || fan > 10000 || fanConc < 1 || fanConc > workflow.MaxConcurrency {
		return badInput("--fan-out=%d --fan-out-concurrency=%d: want 0 to 10000 steps, 1 to %d at once", fan, fanConc, workflow.MaxConcurrency)
	}
	if burst < 0 || burst > 100000 {
		return badInput("--burst=%d: want 0 (no burst) up to 100000 runs", burst)
	}
	if heapProfile != "" && burst == 0 {
		return badInput("--heap-profile needs --burst")
	}
	if burst > 0 {
		if len(modes) != 1 {
			return badInput("--burst measures the process's memory: give one --durability (process or strict), not both")
		}
		return e.benchBurst(ctx, palbench.Options{Strict: modes[0] == DurabilityStrict, InProcess: inproc, Concurrency: max(64, runs)},
			modes[0], burst, runs, spr, heapProfile)
	}
	fo := fanOut{steps: fan, concurrency: fanConc}
	shape := fmt.Sprintf("%d × %d", runs, spr)
	if sustain > 0 {
		shape = fmt.Sprintf("%d in flight × %d, %s", runs, spr, sustain)
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "durability\tstep p50\tstep p99\tsteps/s (1 run)\tsteps/s (concurrent)\tconcurrent runs × steps")
	var fans []string
	for _, m := range modes {
		fmt.Fprintf(e.stderr, "pal bench: %s mode…\n", m)
		seq, conc, fr, err := benchMode(ctx, palbench.Options{Strict: m == DurabilityStrict, InProcess: inproc}, steps, runs, spr, sustain, fo)
		if err != nil {
			return err
		}
		row(tw, m, seq, conc, shape)
		if fo.steps > 0 {
			fans = append(fans, fanOutRow(m, fo, fr, conc, shape))
		}
	}
	if cluster {
		fmt.Fprintln(e.stderr, "pal bench: 3-node cluster (R3)…")
		seq, conc, fr, err := benchCluster(ctx, steps, runs, spr, sustain, fo)
		if err != nil {
			return err
		}
		row(tw, "cluster R3", seq, conc, shape)
		if fo.steps > 0 {
			fans = append(fans, fanOutRow("cluster R3", fo, fr, conc, shape))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(fans) > 0 {
		fmt.Fprintln(e.stdout)
		tw = tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "durability\tfan-out\tsteps/s (fan-out)\tsteps/s (concurrent)\tfan-out / concurrent")
		for _, f := range fans {
			fmt.Fprintln(tw, f)
		}
		return tw.Flush()
	}
	return nil
}

// fanOut is what --fan-out asks for: one run of steps steps, concurrency
// of them in flight at once (0 steps: none).
type fanOut struct{ steps, concurrency int }

// fanOutRow is the fan-out's row: its throughput beside the concurrent
// runs' of the same mode.
func fanOutRow(name string, fo fanOut, fan, conc palbench.Result, shape string) string {
	return fmt.Sprintf("%s\t%d steps, %d at once\t%.0f\t%.0f (%s)\t%.0f%%", name, fo.steps, fo.concurrency,
		fan.StepsPerSecond(), conc.StepsPerSecond(), shape, 100*fan.StepsPerSecond()/conc.StepsPerSecond())
}

func row(tw *tabwriter.Writer, name string, seq, conc palbench.Result, shape string) {
	fmt.Fprintf(tw, "%s\t%s\t%s\t%.0f\t%.0f\t%s\n", name,
		us(seq.Percentile(0.5)), us(seq.Percentile(0.99)), seq.StepsPerSecond(), conc.StepsPerSecond(), shape)
}

// benchCluster measures on three pal dev-nats-node processes (startDevCluster,
// as pal dev --cluster 3), in a temp dir it removes.
func benchCluster(ctx context.Context, steps, runs, spr int, sustain time.Duration, fo fanOut) (seq, conc, fan palbench.Result, err error) {
	dir, err := os.MkdirTemp("", "pal-bench-cluster-*")
	if err != nil {
		return seq, conc, fan, err
	}
	defer os.RemoveAll(dir)
	keys, err := natsauth.LoadOrCreate(dir)
	if err != nil {
		return seq, conc, fan, err
	}
	port, err := freeLoopbackPorts(3)
	if err != nil {
		return seq, conc, fan, err
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := startDevCluster(ctx, 3, dir, "127.0.0.1", port, false, log)
	if err != nil {
		return seq, conc, fan, err
	}
	defer c.stop()
	connect := func() (*nats.Conn, error) { return c.connect(keys, natsauth.Admin, log) }
	// The streams wait for the cluster's meta leader.
	nc, err := connect()
	if err != nil {
		return seq, conc, fan, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return seq, conc, fan, err
	}
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := setupWithRetry(sctx, js, eventstore.Config{Replicas: 3}, log); err != nil {
		return seq, conc, fan, fmt.Errorf("setting up the cluster's streams: %w", err)
	}
	return benchMode(ctx, palbench.Options{Connect: connect, Replicas: 3}, steps, runs, spr, sustain, fo)
}

// freeLoopbackPorts finds n consecutive free loopback ports (the nodes'
// client ports) and returns the first.
func freeLoopbackPorts(n int) (int, error) {
	for range 20 {
		p, err := freeLoopbackPort()
		if err != nil {
			return 0, err
		}
		free := true
		for i := 1; i < n && free; i++ {
			l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p+i)))
			if free = err == nil; free {
				l.Close()
			}
		}
		if free {
			return p, nil
		}
	}
	return 0, errors.New("no run of free loopback ports")
}

// benchMode measures one environment: the sequential run, then one burst
// of runs, or with sustain > 0 runs kept in flight for sustain; then,
// when fo asks for one, the fan-out.
func benchMode(ctx context.Context, o palbench.Options, steps, runs, spr int, sustain time.Duration, fo fanOut) (seq, conc, fan palbench.Result, err error) {
	o.Concurrency = max(64, runs)
	o.RunConcurrency = max(fo.concurrency, 1)
	env, err := palbench.Start(ctx, o)
	if err != nil {
		return seq, conc, fan, err
	}
	defer env.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	// Warm up connections and caches.
	if _, err := env.Runs(ctx, 4, 10); err != nil {
		return seq, conc, fan, err
	}
	if seq, err = env.Runs(ctx, 1, steps); err != nil {
		return seq, conc, fan, err
	}
	if sustain > 0 {
		conc, err = env.Sustain(ctx, runs, spr, time.Second, sustain)
	} else {
		conc, err = env.Runs(ctx, runs, spr)
	}
	if err != nil || fo.steps == 0 {
		return seq, conc, fan, err
	}
	fan, err = env.FanOut(ctx, fo.steps, fo.concurrency)
	return seq, conc, fan, err
}

// benchBurst runs one burst on a fresh environment and prints the
// process's memory at its end.
func (e *env) benchBurst(ctx context.Context, o palbench.Options, mode string, total, runs, spr int, profile string) error {
	fmt.Fprintf(e.stderr, "pal bench: %s mode, %d runs of %d steps, %d in flight…\n", mode, total, spr, runs)
	if profile != "" {
		// A sample every 4 KiB instead of 512 KiB: the profile names the
		// small allocations that add up, too.
		runtime.MemProfileRate = 4 << 10
	}
	env, err := palbench.Start(ctx, o)
	if err != nil {
		return err
	}
	defer env.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	res, err := env.Burst(ctx, total, runs, spr)
	if err != nil {
		return err
	}
	mem, err := palbench.MeasureMemory(profile)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "durability\truns × steps\tin flight\truns/s\tRSS at the end\tanonymous\tfile pages\tGo heap in use\tGo heap held")
	fmt.Fprintf(tw, "%s\t%d × %d\t%d\t%.0f\t%s\t%s\t%s\t%s\t%s\n", mode, total, spr, runs,
		float64(total)/res.Elapsed.Seconds(), mib(mem.RSS), mib(mem.RSSAnon), mib(mem.RSSFile), mib(mem.HeapInuse), mib(mem.HeapSys))
	if err := tw.Flush(); err != nil {
		return err
	}
	if profile != "" {
		fmt.Fprintf(e.stderr, "pal bench: heap profile in %s (go tool pprof -sample_index=inuse_space %s)\n", profile, profile)
	}
	return nil
}

func mib(b uint64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

func us(d time.Duration) string { return fmt.Sprintf("%d µs", d.Microseconds()) }

func (e *env) runEconomics(ctx context.Context, model string) error {
	if err := e.loadPrices(); err != nil {
		return err
	}
	if _, _, ok := provider.PriceOf(model); !ok {
		return badInput("--model=%q: the price table does not know it (add it with PAL_PRICES)", model)
	}
	bin, err := os.Executable()
	if err != nil {
		return err
	}
	fmt.Fprintln(e.stderr, "pal bench: economics: 20 LLM steps, worker killed with SIGKILL at steps 5, 10 and 15…")
	r, err := palbench.Economics(ctx, palbench.EconomicsOptions{Worker: bin, Model: model})
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "%d-step LLM run on %s ($%.2f in / $%.2f out per MTok), worker killed -9 at steps %s; one clean run costs $%.4f\n\n",
		r.Steps, r.Model, r.InputPrice, r.OutPrice, joinInts(r.KillAt), r.CleanCost)
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "after 3 crashes	provider calls	calls charged	re-spent")
	fmt.Fprintf(tw, "restart from scratch	%d	%d	$%.4f\n", r.ScratchCalls, r.ScratchCalls, r.ScratchReSpent)
	fmt.Fprintf(tw, "PAL, provider ignores keys	%d	%d	$%.4f\n", r.Calls, r.Calls, r.ReSpentWithoutDedup)
	fmt.Fprintf(tw, "PAL, provider dedups by key	%d	%d	$%.4f\n", r.Calls, r.ChargedCalls, r.ReSpent)
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "\n%d worker processes; the journal's cost_usd totals $%.4f; took %s\n", r.Workers, r.JournalCost, r.Elapsed.Round(time.Millisecond))
	return nil
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = fmt.Sprint(n)
	}
	return strings.Join(s, ", ")
}
