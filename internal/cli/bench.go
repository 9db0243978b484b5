package cli

import (
	"context"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/palrun/pal/internal/bench"
	"github.com/palrun/pal/provider"
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
    steps per second from the first start to the last run_succeeded.

The worker reaches the server over loopback TCP unless --in-process.

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
	f.Bool("in-process", false, "connect the worker to NATS in-process")
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
		return badInput("--durability=%q: want process, strict or both", mode)
	}
	if steps < 2 || runs < 1 || spr < 1 {
		return badInput("--steps must be ≥ 2, --runs and --steps-per-run ≥ 1")
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "durability\tstep p50\tstep p99\tsteps/s (1 run)\tsteps/s (concurrent)\tconcurrent runs × steps")
	for _, m := range modes {
		fmt.Fprintf(e.stderr, "pal bench: %s mode…\n", m)
		seq, conc, err := benchMode(ctx, m == DurabilityStrict, inproc, steps, runs, spr)
		if err != nil {
			return err
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.0f\t%.0f\t%d × %d\n", m,
			us(seq.Percentile(0.5)), us(seq.Percentile(0.99)), seq.StepsPerSecond(), conc.StepsPerSecond(), runs, spr)
	}
	return tw.Flush()
}

func benchMode(ctx context.Context, strict, inproc bool, steps, runs, spr int) (bench.Result, bench.Result, error) {
	env, err := bench.Start(ctx, bench.Options{Strict: strict, InProcess: inproc, Concurrency: max(64, runs)})
	if err != nil {
		return bench.Result{}, bench.Result{}, err
	}
	defer env.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	// Warm up connections and caches.
	if _, err := env.Runs(ctx, 4, 10); err != nil {
		return bench.Result{}, bench.Result{}, err
	}
	seq, err := env.Runs(ctx, 1, steps)
	if err != nil {
		return seq, bench.Result{}, err
	}
	conc, err := env.Runs(ctx, runs, spr)
	return seq, conc, err
}

func us(d time.Duration) string { return fmt.Sprintf("%d µs", d.Microseconds()) }

func (e *env) runEconomics(ctx context.Context, model string) error {
	if path := e.getenv(provider.EnvPrices); path != "" {
		if err := provider.LoadPrices(path); err != nil {
			return withCode(ExitBadInput, err)
		}
	}
	if _, _, ok := provider.PriceOf(model); !ok {
		return badInput("--model=%q: the price table does not know it (add it with PAL_PRICES)", model)
	}
	bin, err := os.Executable()
	if err != nil {
		return err
	}
	fmt.Fprintln(e.stderr, "pal bench: economics: 20 LLM steps, worker killed with SIGKILL at steps 5, 10 and 15…")
	r, err := bench.Economics(ctx, bench.EconomicsOptions{Worker: bin, Model: model})
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
