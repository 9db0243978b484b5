package workers_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/runs"
)

// maxWorkerRSS is the bound a pal worker's peak resident memory must stay
// under while it evaluates the bombs below: the evaluation budgets
// (workflow.MaxEvalBytes, 16 MiB, and the operation and time bounds) plus
// the process's own footprint and the bombs' 900 KB inputs.
const maxWorkerRSS = 256 << 20

// TestEvaluationBombsFailTheirRunWithinBounds gives a real pal worker
// conditions whose cost depends on the run input, so parsing cannot refuse
// them: a 1 GB string built by repeat, and a regexp over 900 KB matched a
// million times. Each run fails with an evaluation-limit error, the
// worker's peak RSS stays under maxWorkerRSS, and the worker goes on to
// drive an ordinary run.
func TestEvaluationBombsFailTheirRunWithinBounds(t *testing.T) {
	t.Parallel()
	p := setupProc(t, 3*time.Second)
	ctx := ctxFor(t, 2*time.Minute)
	w := p.palWorker(t, "w1")

	bomb := func(expr string) json.RawMessage {
		return json.RawMessage(fmt.Sprintf(`{"name":"bomb","nodes":[{"id":"start","type":"trigger"},
			{"id":"c","type":"condition","data":{"expression":%q}}],"edges":[{"from":"start","to":"c"}]}`, expr))
	}
	big := strings.Repeat("a", 900_000)
	cases := map[string]struct {
		wf    json.RawMessage
		input any
	}{
		"memory": {bomb(`len(repeat(input.s, input.n)) > 0`), map[string]any{"s": strings.Repeat("a", 1000), "n": 999_999}},
		"cpu":    {bomb(`any(1..999990, {input.s matches "(a|aa)*c"})`), map[string]any{"s": big}},
	}
	for name, tc := range cases {
		in, err := json.Marshal(tc.input)
		require.NoError(t, err)
		res, err := p.Runs.Start(ctx, runs.StartCommand{Rights: runs.AllRights, Workflow: tc.wf, Input: in})
		require.NoError(t, err, name)
		end := p.WaitEnd(t, res.RunID)
		require.Equal(t, event.RunFailed, end.Kind, "%s: %s", name, end.Data)
		require.Contains(t, string(end.Data), "evaluation limit exceeded", name)
	}
	rss := peakRSS(t, w.PID())
	t.Logf("pal worker peak RSS: %d MiB", rss>>20)
	require.Less(t, rss, int64(maxWorkerRSS), "peak RSS of the worker")

	ok := p.Start(t, echoChain(2), `{}`)
	require.Equal(t, event.RunSucceeded, p.WaitEnd(t, ok).Kind, "the worker still drives runs")
}

// peakRSS reads a process's peak resident set size (VmHWM) in bytes.
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			require.NoError(t, err)
			return kb << 10
		}
	}
	t.Fatal("no VmHWM in /proc/<pid>/status")
	return 0
}
