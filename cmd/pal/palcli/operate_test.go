package palcli_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/paltest"
)

func TestRunSignalResumeForkRetry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	wait := `{"name":"wait-go","nodes":[{"id":"start","type":"trigger"},
		{"id":"hold","type":"wait","data":{"signal":"go"}},
		{"id":"done","type":"tool","data":{"tool":"echo","input":{"n":"{{steps.hold.output.n}}"}}}],
		"edges":[{"from":"start","to":"hold"},{"from":"hold","to":"done"}]}`
	id := b.start(t, wait, `{}`)
	b.WaitFor(t, id, "the wait", func(ev event.Event) bool { return ev.Kind == event.StepWaiting })
	r := b.pal(t, nil, "run", "signal", id, "nope")
	require.Equal(t, 2, r.code, "%s", r)
	require.Contains(t, r.stderr, `no wait node waits for signal "nope"`)
	r = b.pal(t, nil, "run", "signal", id, "go", "--payload", `{"n":`)
	require.Equal(t, 2, r.code, "%s", r)
	r = b.pal(t, nil, "run", "signal", id, "go", "--payload", `{"n":3}`, "--by", "ops")
	require.Equal(t, 0, r.code, "%s", r)
	require.Equal(t, "sent signal go to run "+id+"\n", r.stdout)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, id).Kind)
	r = b.pal(t, nil, "run", "events", id)
	require.Regexp(t, `signal_received\s+signal go by ops: \{"n":3\}`, r.stdout)

	// An ended run's journal stays closed.
	r = b.pal(t, nil, "run", "resume", id)
	require.Equal(t, 2, r.code, "%s", r)
	require.Contains(t, r.stderr, "pal run retry "+id)

	// A run that fails at s2; retry copies s1 and runs s2 again.
	wf := paltest.Chain("fails", 3, func(i int, _ string) (string, string) {
		prompt := fmt.Sprintf("step %d", i)
		if i == 2 {
			prompt = "FAIL here"
		}
		return fmt.Sprintf("s%d", i), fmt.Sprintf(`{"id":"s%d","type":"ai-step","data":{"provider":"openai","model":"gpt-4o-mini","prompt":%q}}`, i, prompt)
	})
	src := b.start(t, wf, `{}`)
	require.Equal(t, event.RunFailed, b.WaitEnd(t, src).Kind)
	r = b.pal(t, nil, "run", "retry", src)
	require.Equal(t, 0, r.code, "%s", r)
	retried := strings.TrimSpace(r.stdout)
	require.NoError(t, event.ValidateRunID(retried))
	require.Contains(t, r.stderr, "forked from run "+src+" at step s2")
	require.Contains(t, r.stderr, "copied  s1")
	require.Equal(t, event.RunFailed, b.WaitEnd(t, retried).Kind, "s2 runs again, and fails again")
	keys := b.LLM.Keys()
	require.Zero(t, keys[event.IdempotencyKey(retried, "s1", 1)])
	require.Equal(t, 1, keys[event.IdempotencyKey(retried, "s2", 1)])

	// Fork from s2 with s2's prompt fixed: s2 and s3 run, s1 is copied.
	fixed := strings.Replace(wf, "FAIL here", "step 2", 1)
	r = b.pal(t, nil, "run", "fork", src, "--from", "s2", "--workflow", b.file(t, "fixed.json", fixed), "--json")
	require.Equal(t, 0, r.code, "%s", r)
	got := decodeJSON[map[string]any](t, r.stdout)
	require.Equal(t, []any{"s1"}, got["copied"])
	fork := got["run_id"].(string)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, fork).Kind)
	r = b.pal(t, nil, "run", "events", fork)
	require.Regexp(t, `step_completed\s+s1\s.*copied from `+src, r.stdout)
}

// TestRunRetryRefusalsAndRenderFailure: retry's refusals say why in a
// retry's words (still conflict, exit 2); a run that failed rendering a
// step's input, before the step started, is retried from that step with
// every completed step copied.
func TestRunRetryRefusalsAndRenderFailure(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ok := b.start(t, seqWorkflow(1), `{"text":"x"}`)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, ok).Kind)
	r := b.pal(t, nil, "run", "retry", ok)
	require.Equal(t, 2, r.code, "%s", r)
	require.Contains(t, r.stderr, "retrying run "+ok+": it succeeded, so no step failed to retry; fork it from a step instead")
	require.NotContains(t, r.stderr, "not waiting")
	r = b.pal(t, nil, "run", "retry", ok, "--json")
	require.Equal(t, 2, r.code, "%s", r)
	require.Equal(t, "conflict", decodeJSON[map[string]any](t, r.stdout)["error"])

	// s1's output has no field "text": deploy's input cannot render.
	wf := `{"name":"render-fails","nodes":[{"id":"start","type":"trigger"},
		{"id":"s1","type":"tool","data":{"tool":"echo","input":{"n":1}}},
		{"id":"deploy","type":"tool","data":{"tool":"echo","input":{"t":"{{steps.s1.output.text}}"}}}],
		"edges":[{"from":"start","to":"s1"},{"from":"s1","to":"deploy"}]}`
	src := b.start(t, wf, `{}`)
	final := b.WaitEnd(t, src)
	require.Equal(t, event.RunFailed, final.Kind)
	require.Equal(t, "deploy", failedStep(t, final), "run_failed names the step")
	r = b.pal(t, nil, "run", "events", src)
	require.NotRegexp(t, `step_started\s+deploy`, r.stdout, "deploy never started")

	r = b.pal(t, nil, "run", "retry", src, "--json")
	require.Equal(t, 0, r.code, "%s", r)
	got := decodeJSON[map[string]any](t, r.stdout)
	require.Equal(t, "deploy", got["forked_from"].(map[string]any)["step_id"], "%s", r)
	require.Equal(t, float64(final.Seq), got["forked_from"].(map[string]any)["seq"], "forked at the run_failed")
	require.Equal(t, []any{"s1"}, got["copied"])
	retried := got["run_id"].(string)
	end := b.WaitEnd(t, retried)
	require.Equal(t, event.RunFailed, end.Kind, "deploy renders the same input, and fails again")
	require.Equal(t, "deploy", failedStep(t, end))
	r = b.pal(t, nil, "run", "events", retried)
	require.Regexp(t, `step_completed\s+s1\s.*copied from `+src, r.stdout)
}

// failedStep is the step a run_failed names.
func failedStep(t *testing.T, ev event.Event) string {
	t.Helper()
	var d event.RunFailedData
	require.NoError(t, ev.DecodeData(&d))
	return d.StepID
}
