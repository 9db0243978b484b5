package cli_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/internal/paltest"
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
