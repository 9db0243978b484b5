package runs_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/internal/telemetry"
	"github.com/palrun/pal/runs"
)

// refused reads pal_commands_refused_total{command,reason} from PAL's
// registry.
func refused(t *testing.T, command, reason string) float64 {
	t.Helper()
	mfs, err := telemetry.Registry.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "pal_commands_refused_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["command"] == command && labels["reason"] == reason {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// Every command method counts its refusals under its own name, once: a
// budget raise, a resume, a fork and a retry too (a fork's refused start
// counts as the fork's, not as a start). Not parallel: the counters are
// the process's.
func TestRefusedCommandsAreCountedOnce(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	b.worker(t, "w1", nil)
	src := b.Start(t, echoChain(1), `{}`)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, src).Kind)

	type count struct{ command, reason string }
	counts := []count{{"budget", "not_found"}, {"resume", "run_finished"}, {"fork", "bad_input"},
		{"fork", "run_exists"}, {"start", "run_exists"}, {"retry", "not_waiting"}}
	before := map[count]float64{}
	for _, c := range counts {
		before[c] = refused(t, c.command, c.reason)
	}
	require.ErrorIs(t, b.Runs.RaiseBudget(ctx, runs.BudgetCommand{RunID: "run_nope", AddSteps: 1}), runs.ErrRunNotFound)
	_, err := b.Runs.Resume(ctx, runs.ResumeCommand{RunID: src})
	require.ErrorIs(t, err, runs.ErrRunFinished)
	_, err = b.Runs.Fork(ctx, runs.ForkCommand{Rights: runs.AllRights, RunID: src, From: "nope"})
	var ie *runs.InputError
	require.ErrorAs(t, err, &ie)
	_, err = b.Runs.Fork(ctx, runs.ForkCommand{Rights: runs.AllRights, RunID: src, From: "t1", NewRunID: src})
	require.ErrorIs(t, err, runs.ErrRunExists)
	_, err = b.Runs.Retry(ctx, runs.RetryCommand{Rights: runs.AllRights, RunID: src})
	require.ErrorIs(t, err, runs.ErrNotWaiting)

	want := map[count]float64{{"budget", "not_found"}: 1, {"resume", "run_finished"}: 1, {"fork", "bad_input"}: 1,
		{"fork", "run_exists"}: 1, {"start", "run_exists"}: 0, {"retry", "not_waiting"}: 1}
	for _, c := range counts {
		require.Equal(t, want[c], refused(t, c.command, c.reason)-before[c], "%s/%s", c.command, c.reason)
	}
}
