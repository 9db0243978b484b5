package cli

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/palrun/pal/internal/bench"
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

The worker reaches the server over loopback TCP unless --in-process.`,
		Args: cobra.NoArgs,
		RunE: e.runBench,
	}
	f := cmd.Flags()
	f.String("durability", "both", "process, strict or both")
	f.Int("steps", 500, "steps of the sequential run")
	f.Int("runs", 64, "concurrent runs")
	f.Int("steps-per-run", 50, "steps of each concurrent run")
	f.Bool("in-process", false, "connect the worker to NATS in-process")
	return cmd
}

func (e *env) runBench(cmd *cobra.Command, _ []string) error {
	ctx := cmd.Context()
	mode, _ := cmd.Flags().GetString("durability")
	steps, _ := cmd.Flags().GetInt("steps")
	runs, _ := cmd.Flags().GetInt("runs")
	spr, _ := cmd.Flags().GetInt("steps-per-run")
	inproc, _ := cmd.Flags().GetBool("in-process")
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
