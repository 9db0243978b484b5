package palcli_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/paltest/testenv"
	"github.com/palrun/pal/provider/providertest"
	"github.com/palrun/pal/runs"
)

func TestRunGetWatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.start(t, seqWorkflow(2), `{"text":"hello"}`)

	// watch: human progress until the end, exit 0.
	r := b.pal(t, nil, "run", "watch", id)
	require.Equal(t, 0, r.code, "%s", r)
	require.Contains(t, r.stdout, "watching run "+id+" (workflow=seq-2)")
	require.Regexp(t, `(?m)^\s+\d+\s+\S+\s+step_completed\s+s2\s`, r.stdout)
	require.Regexp(t, `(?m)^run `+id+` succeeded after \S+$`, r.stdout)
	// watch --json: the journal, one envelope a line.
	r = b.pal(t, nil, "run", "watch", id, "--json")
	require.Equal(t, 0, r.code, "%s", r)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	journal := b.Events(t, id)
	require.Len(t, lines, len(journal))
	for i, l := range lines {
		ev := decodeJSON[event.Event](t, l)
		require.Equal(t, journal[i].Seq, ev.Seq)
		require.Equal(t, journal[i].Kind, ev.Kind)
	}

	// get: human.
	r = b.pal(t, nil, "run", "get", id)
	require.Equal(t, 0, r.code, "%s", r)
	for _, re := range []string{`(?m)^Run\s+` + id + `$`, `(?m)^Status\s+succeeded$`, `(?m)^Workflow\s+seq-2$`,
		`(?m)^Ended\s+.* took \S+$`, `(?m)^Usage\s+\d+ tokens \(\d+ in, \d+ out\), \$\d+\.\d{6}$`,
		`(?m)^STEP\s+TYPE\s+STATUS\s+ATTEMPT\s+START\s+DURATION\s+WAIT\s+TOKENS\s+COST\s+RESULT$`,
		`(?m)^s1\s+ai-step\s+completed\s+1\s+\+\S+\s+\S+\s+-\s+\d+\s+\$\d+\.\d{6}\s+openai/gpt-4o-mini: echo: step 1: hello$`,
		`(?m)^s2\s+ai-step\s+completed\s+1\s`, `\(read from its journal on NATS \(PAL_EVENTS\) up to seq \d+\)`} {
		require.Regexp(t, re, r.stdout)
	}
	// get --json: the RunView, and where it came from.
	r = b.pal(t, nil, "run", "get", id, "--json")
	require.Equal(t, 0, r.code, "%s", r)
	var out struct {
		runs.RunView
		Source string `json:"source"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &out), r.stdout)
	require.Equal(t, "journal", out.Source)
	require.Equal(t, id, out.RunID)
	require.Equal(t, "succeeded", string(out.Status))
	require.Len(t, out.Steps, 2)
	require.Equal(t, uint64(len(journal)), out.LastSeq)

	// events (kept as it was): one line per event.
	r = b.pal(t, nil, "run", "events", id)
	require.Equal(t, 0, r.code, "%s", r)
	require.Len(t, strings.Split(strings.TrimSpace(r.stdout), "\n"), len(journal))
}

func TestRunFailedAndCancelled(t *testing.T) {
	t.Parallel()
	b := setup(t)

	// A run that fails: watch and start --wait exit 1.
	failed := b.start(t, seqWorkflow(1), `{"text":"FAIL please"}`)
	r := b.pal(t, nil, "run", "watch", failed)
	require.Equal(t, 1, r.code, "%s", r)
	require.Regexp(t, `pal: run `+failed+` failed after \S+: `, r.stderr)
	require.Contains(t, r.stdout, "run_failed")
	r = b.pal(t, nil, "run", "watch", failed, "--json")
	require.Equal(t, 1, r.code, "%s", r)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	require.Equal(t, event.RunFailed, decodeJSON[event.Event](t, lines[len(lines)-1]).Kind, "no error object after the events")
	r = b.pal(t, nil, "run", "start", "--workflow", b.file(t, "f.json", seqWorkflow(1)), "--input", `{"text":"FAIL"}`, "--wait")
	require.Equal(t, 1, r.code, "%s", r)
	r = b.pal(t, nil, "run", "get", failed)
	require.Equal(t, 0, r.code, "%s", r)
	require.Regexp(t, `(?m)^Status\s+failed$`, r.stdout)
	require.Regexp(t, `(?m)^Error\s+step_failed: .*\(step s1\)$`, r.stdout)

	// A run in flight: watch follows it live while it is cancelled.
	hold := b.LLM.Hold(nil)
	t.Cleanup(hold.Release)
	id := b.start(t, seqWorkflow(2), `{"text":"slow"}`)
	_, err := hold.Wait(context.Background())
	require.NoError(t, err)
	watch := startPal(t, b, "run", "watch", id)
	watch.waitLine(t, "step_started")

	before := b.journal(t)
	r = b.pal(t, nil, "run", "approve", id, "--step", "s1", "--approver", "ann")
	require.Equal(t, 2, r.code, "%s", r)
	require.Contains(t, r.stderr, "not waiting")
	r = b.pal(t, nil, "run", "approve", id, "--step", "s1", "--approver", "ann", "--reject", "--comment", "no", "--json")
	require.Equal(t, 2, r.code, "%s", r)
	require.Equal(t, "conflict", decodeJSON[map[string]any](t, r.stdout)["error"])
	require.Equal(t, before, b.journal(t), "a refused approval wrote something")

	r = b.pal(t, nil, "run", "cancel", id, "--reason", "enough")
	require.Equal(t, 0, r.code, "%s", r)
	require.Equal(t, "cancelled run "+id+"\n", r.stdout)
	code, stdout, stderr := watch.wait(t)
	require.Equal(t, 1, code, "watch exits 1 for a cancelled run\n%s\n%s", stdout, stderr)
	require.Contains(t, stdout, "run_cancelled")
	require.Regexp(t, `pal: run `+id+` was cancelled after \S+ by pal-cli: enough`, stderr)
	final := b.WaitEnd(t, id)
	require.Equal(t, event.RunCancelled, final.Kind)

	before = b.journal(t)
	r = b.pal(t, nil, "run", "cancel", id)
	require.Equal(t, 2, r.code, "%s", r)
	require.Contains(t, r.stderr, "already finished (cancelled); nothing was written")
	r = b.pal(t, nil, "run", "cancel", id, "--json")
	require.Equal(t, 2, r.code, "%s", r)
	m := decodeJSON[map[string]any](t, r.stdout)
	require.Equal(t, "conflict", m["error"])
	require.Contains(t, m["detail"], "already finished")
	require.Equal(t, before, b.journal(t), "cancelling a finished run wrote something")

	other := b.start(t, seqWorkflow(1), `{"text":"x"}`)
	r = b.pal(t, nil, "run", "cancel", other, "--by", "ops", "--json")
	require.Equal(t, 0, r.code, "%s", r)
	require.Equal(t, map[string]any{"ok": true, "run_id": other}, decodeJSON[map[string]any](t, r.stdout))
	require.Equal(t, "ops", b.WaitEnd(t, other).WorkerID)
}

// TestRunExitCodes: unknown runs (3), bad run ids and flags (2), NATS
// unreachable (4), each with a message and, with --json, an error object.
func TestRunExitCodes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	down := []string{"PAL_NATS_URL=nats://127.0.0.1:" + fmt.Sprint(testenv.FreePort(t))}
	before := b.journal(t)
	for _, tc := range []struct {
		env  []string
		args []string
		code int
		msg  string
	}{
		{nil, []string{"run", "get", "run_nope"}, 3, "run run_nope not found"},
		{nil, []string{"run", "watch", "run_nope"}, 3, "run run_nope not found"},
		{nil, []string{"run", "events", "run_nope"}, 3, "not found"},
		{nil, []string{"run", "cancel", "run_nope"}, 3, "not found"},
		{nil, []string{"run", "approve", "run_nope", "--step", "s1", "--approver", "ann"}, 3, "not found"},
		{nil, []string{"run", "get", "a.b"}, 2, "invalid run id"},
		{nil, []string{"run", "watch", ">"}, 2, "invalid run id"},
		{nil, []string{"run", "cancel", "pal.events.*"}, 2, "invalid run id"},
		{nil, []string{"run", "approve", "a b", "--step", "s1", "--approver", "ann"}, 2, "invalid run id"},
		{nil, []string{"run", "approve", "run_x", "--step", "s1"}, 2, `required flag(s) "approver" not set`},
		{nil, []string{"run", "get"}, 2, "accepts 1 arg"},
		{nil, []string{"run", "list"}, 2, "DATABASE_URL is not set"},
		{[]string{"DATABASE_URL=postgres://x@127.0.0.1:1/x"}, []string{"run", "list", "--status", "done"}, 2, `"done": want one of queued, running`},
		{[]string{"DATABASE_URL=postgres://x@127.0.0.1:1/x"}, []string{"run", "list", "--limit", "0"}, 2, `--limit: "0": want a whole number from 1 to 1000`},
		{[]string{"DATABASE_URL=postgres://x@127.0.0.1:1/x"}, []string{"run", "list"}, 4, "cannot reach Postgres"},
		{down, []string{"run", "get", "run_x"}, 4, "cannot reach NATS"},
		{down, []string{"run", "watch", "run_x"}, 4, "cannot reach NATS"},
		{down, []string{"run", "cancel", "run_x"}, 4, "cannot reach NATS"},
		{down, []string{"run", "approve", "run_x", "--step", "s1", "--approver", "ann"}, 4, "cannot reach NATS"},
		// Sizes at the door: nothing is read past the limit, nothing is sent.
		{nil, []string{"run", "start", "--workflow", "/dev/zero"}, 2, "larger than the limit of 1048576 bytes"},
		{nil, []string{"run", "start", "--workflow", "-", "--input", "@/dev/zero"}, 2, "larger than the limit of 1048576 bytes"},
		{nil, []string{"run", "approve", "run_x", "--step", "s1", "--approver", "ann", "--comment", strings.Repeat("c", 5000)}, 2, "the limit is 4096"},
		{nil, []string{"run", "cancel", "run_x", "--reason", strings.Repeat("r", 5000)}, 2, "the limit is 4096"},
	} {
		r := b.pal(t, tc.env, tc.args...)
		require.Equal(t, tc.code, r.code, "%v\n%s", tc.args, r)
		require.Contains(t, r.stderr, tc.msg, "%v", tc.args)
		require.Empty(t, r.stdout, "%v", tc.args)
		if tc.args[1] == "events" || strings.HasPrefix(tc.msg, "required") || strings.HasPrefix(tc.msg, "accepts") {
			continue // no JSON errors: pal run events as it was; cobra's own usage errors
		}
		r = b.pal(t, tc.env, append(tc.args, "--json")...)
		require.Equal(t, tc.code, r.code, "%v --json\n%s", tc.args, r)
		m := decodeJSON[map[string]any](t, r.stdout)
		want := map[int]string{2: "bad_input", 3: "not_found", 4: "unavailable"}[tc.code]
		require.Equal(t, want, m["error"], "%v", tc.args)
		require.NotEmpty(t, m["detail"])
	}
	require.Equal(t, before, b.journal(t), "refused commands wrote something")
}

// TestRunListAndGetFromPostgres reads the projection: pal run list, and
// pal run get with DATABASE_URL.
func TestRunListAndGetFromPostgres(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.project(t)
	var ids []string
	for _, text := range []string{"one", "FAIL two", "three"} {
		id := b.start(t, seqWorkflow(2), fmt.Sprintf(`{"text":%q}`, text))
		b.WaitEnd(t, id)
		ids = append(ids, id)
	}
	other := b.start(t, paltest.Chain("other", 1, func(int, string) (string, string) {
		return "s1", `{"id":"s1","type":"ai-step","data":{"provider":"openai","model":"gpt-4o-mini","prompt":"other"}}`
	}), `{}`)
	b.WaitEnd(t, other)
	p.caughtUp(t)
	db := p.db

	r := b.pal(t, db, "run", "list", "--workflow", "other", "--json")
	require.Equal(t, 0, r.code, "%s", r)
	require.Equal(t, []string{other}, runIDs(decodeJSON[runs.RunList](t, r.stdout)), "--workflow keeps that workflow's runs")
	r = b.pal(t, db, "run", "list", "--workflow", strings.Repeat("w", 300))
	require.Equal(t, 2, r.code, "%s", r)

	r = b.pal(t, db, "run", "list", "--workflow", "seq-2")
	require.Equal(t, 0, r.code, "%s", r)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	require.Len(t, lines, 4, r.stdout)
	require.Regexp(t, `^RUN ID\s+STATUS\s+WORKFLOW\s+CREATED\s+DURATION\s+TOKENS\s+COST\s+ERROR$`, lines[0])
	require.Regexp(t, `^`+ids[2]+`\s+succeeded\s+seq-2\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\s+\S+\s+\d+\s+\$0\.0000\d*[1-9]\s+-$`, lines[1]) // a few millionths of a dollar, not $0.0000
	require.Regexp(t, `^`+ids[1]+`\s+failed\s+seq-2\s.*step_failed: `, lines[2])
	require.Regexp(t, `^`+ids[0]+`\s+succeeded\s`, lines[3])

	r = b.pal(t, db, "run", "list", "--json", "--status", "failed", "--workflow", "seq-2")
	require.Equal(t, 0, r.code, "%s", r)
	list := decodeJSON[runs.RunList](t, r.stdout)
	require.Len(t, list.Runs, 1)
	require.Equal(t, ids[1], list.Runs[0].RunID)
	require.Equal(t, "step_failed", list.Runs[0].ErrorCode)

	r = b.pal(t, db, "run", "list", "--limit", "2", "--json", "--workflow", "seq-2")
	require.Equal(t, 0, r.code, "%s", r)
	list = decodeJSON[runs.RunList](t, r.stdout)
	require.Len(t, list.Runs, 2)
	require.NotEmpty(t, list.Next)
	r = b.pal(t, db, "run", "list", "--limit", "2", "--workflow", "seq-2")
	require.Contains(t, r.stderr, "more: pal run list --before "+list.Next+" --workflow seq-2 --limit 2")
	r = b.pal(t, db, "run", "list", "--limit", "2", "--before", list.Next, "--json", "--workflow", "seq-2")
	require.Equal(t, 0, r.code, "%s", r)
	list = decodeJSON[runs.RunList](t, r.stdout)
	require.Len(t, list.Runs, 1)
	require.Equal(t, ids[0], list.Runs[0].RunID)
	r = b.pal(t, db, "run", "list", "--before", "nonsense")
	require.Equal(t, 2, r.code, "%s", r)

	r = b.pal(t, db, "run", "get", ids[1])
	require.Equal(t, 0, r.code, "%s", r)
	require.Regexp(t, `(?m)^Status\s+failed$`, r.stdout)
	require.Contains(t, r.stdout, "(read from the Postgres projection up to seq")
	type getOut struct {
		runs.RunView
		Source string `json:"source"`
	}
	fromPG := decodeJSON[getOut](t, b.pal(t, db, "run", "get", ids[0], "--json").stdout)
	fromJournal := decodeJSON[getOut](t, b.pal(t, db, "run", "get", ids[0], "--json", "--journal").stdout)
	require.Equal(t, "postgres", fromPG.Source)
	require.Equal(t, "journal", fromJournal.Source)
	require.Equal(t, fromJournal.Status, fromPG.Status)
	require.Equal(t, fromJournal.LastSeq, fromPG.LastSeq)
	require.Equal(t, fromJournal.Usage, fromPG.Usage)
	require.Len(t, fromPG.Steps, len(fromJournal.Steps))
	for i := range fromPG.Steps {
		require.Equal(t, fromJournal.Steps[i].StepID, fromPG.Steps[i].StepID)
		require.Equal(t, fromJournal.Steps[i].Status, fromPG.Steps[i].Status)
		require.JSONEq(t, string(fromJournal.Steps[i].Output), string(fromPG.Steps[i].Output))
	}
	// A run the projection does not hold (yet) is read from the journal.
	require.NoError(t, p.Stop(context.Background()))
	late := b.start(t, seqWorkflow(1), `{"text":"late"}`)
	b.WaitEnd(t, late)
	r = b.pal(t, db, "run", "get", late, "--json")
	require.Equal(t, 0, r.code, "%s", r)
	require.Equal(t, "journal", decodeJSON[getOut](t, r.stdout).Source)
}

// palProcess is a pal command running in the background.
type palProcess struct {
	cmd            *exec.Cmd
	mu             sync.Mutex
	stdout, stderr bytes.Buffer
	lines          chan string
	done           chan struct{}
}

func startPal(t *testing.T, b *bundle, args ...string) *palProcess {
	t.Helper()
	p := &palProcess{lines: make(chan string, 100), done: make(chan struct{})}
	p.cmd = exec.Command(b.bin, args...)
	p.cmd.Env = hermetic("PAL_NATS_URL=" + b.NATS.URL())
	p.cmd.Stderr = &lockedWriter{mu: &p.mu, w: &p.stderr}
	out, err := p.cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, p.cmd.Start())
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.mu.Lock()
			p.stdout.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
			select {
			case p.lines <- sc.Text():
			default:
			}
		}
	}()
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill()
			_ = p.cmd.Wait()
		}
	})
	return p
}

// waitLine waits for a line of stdout containing s.
func (p *palProcess) waitLine(t *testing.T, s string) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case l := <-p.lines:
			if strings.Contains(l, s) {
				return
			}
		case <-timeout:
			t.Fatalf("no line with %q", s)
		}
	}
}

// wait waits for the process to exit.
func (p *palProcess) wait(t *testing.T) (int, string, string) {
	t.Helper()
	<-p.done
	err := p.cmd.Wait()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else {
		require.NoError(t, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return code, p.stdout.String(), p.stderr.String()
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

func TestRunApprove(t *testing.T) {
	t.Parallel()
	b := setup(t)
	wf := `{"name":"gate","nodes":[{"id":"start","type":"trigger"},
		{"id":"ok","type":"approval","data":{"prompt":"Ship it?"}},
		{"id":"done","type":"tool","data":{"tool":"echo"}}],
		"edges":[{"from":"start","to":"ok"},{"from":"ok","to":"done"}]}`
	id := b.start(t, wf, `{}`)
	watch := startPal(t, b, "run", "watch", id)
	watch.waitLine(t, "step_waiting")
	r := b.pal(t, nil, "run", "get", id)
	require.Regexp(t, `(?m)^Status\s+waiting$`, r.stdout)
	require.Regexp(t, `(?m)^ok\s+approval\s+waiting\s`, r.stdout)
	// The waiting approval: what it asks, who decides, the command.
	require.Regexp(t, `(?m)^Step ok waits for approval for \S+\.$`, r.stdout)
	require.Regexp(t, `(?m)^  Prompt:\s+Ship it\?$`, r.stdout)
	require.Regexp(t, `(?m)^  Who:\s+anyone whose token has scope approve$`, r.stdout)
	require.Regexp(t, `(?m)^  Approve:\s+pal run approve `+id+` --step ok --approver NAME$`, r.stdout)
	// The waterfall: one row per step, the wait drawn to now.
	r = b.pal(t, nil, "run", "get", id, "--waterfall", "--width", "90")
	require.Equal(t, 0, r.code, "%s", r)
	require.Regexp(t, `(?m)^STEP\s+0\s+\S+\s+\S+$`, r.stdout)
	require.Regexp(t, `(?m)^ok approval\s+\| *=*~+\| waiting \S+…$`, r.stdout)
	for _, l := range strings.Split(r.stdout, "\n") {
		if strings.Contains(l, "|") || strings.HasPrefix(l, "STEP") {
			require.LessOrEqual(t, len([]rune(l)), 90, "the waterfall keeps to --width: %q", l)
		}
	}
	require.Contains(t, r.stdout, "Approve:   pal run approve "+id+" --step ok")

	r = b.pal(t, nil, "run", "approve", id, "--step", "ok", "--approver", "ann", "--comment", "ship it")
	require.Equal(t, 0, r.code, "%s", r)
	require.Equal(t, "approved step ok of run "+id+" (by ann)\n", r.stdout)
	code, stdout, stderr := watch.wait(t)
	require.Equal(t, 0, code, "%s\n%s", stdout, stderr)
	require.Regexp(t, `(?m)^run `+id+` succeeded after \S+$`, stdout)
	require.Regexp(t, `(?m)\sstep_waiting\s+ok\s+waiting for approval$`, stdout)
	require.Regexp(t, `(?m)\sapproval_received\s+ok\s+approve by ann: ship it$`, stdout)

	before := b.journal(t)
	r = b.pal(t, nil, "run", "approve", id, "--step", "ok", "--approver", "ann", "--reject", "--json")
	require.Equal(t, 2, r.code, "%s", r)
	require.Equal(t, "conflict", decodeJSON[map[string]any](t, r.stdout)["error"])
	require.Equal(t, before, b.journal(t))

	// --reject, --json: the run fails.
	id = b.start(t, wf, `{}`)
	b.WaitFor(t, id, "the approval wait", func(ev event.Event) bool { return ev.Kind == event.StepWaiting })
	r = b.pal(t, nil, "run", "approve", id, "--step", "ok", "--approver", "ann", "--reject", "--json")
	require.Equal(t, 0, r.code, "%s", r)
	require.Equal(t, map[string]any{"ok": true, "run_id": id}, decodeJSON[map[string]any](t, r.stdout))
	r = b.pal(t, nil, "run", "watch", id)
	require.Equal(t, 1, r.code, "%s", r)
}

// TestRunStartBudget: a --budget wider than the workflow's is refused as
// bad input — exit 2 and, with --json, bad_input naming the field, as REST
// answers 400 — and writes nothing; a narrower one is kept, and pal run
// get shows a limit under $0.0001 as it is.
func TestRunStartBudget(t *testing.T) {
	t.Parallel()
	b := setup(t)
	wf := b.file(t, "budgeted.json", `{"name":"budgeted","policy":{"budget":{"maxCostUsd":1}},
		"nodes":[{"id":"start","type":"trigger"},{"id":"t1","type":"tool","data":{"tool":"echo","input":{"i":1}}}],
		"edges":[{"from":"start","to":"t1"}]}`)
	before := b.journal(t)
	r := b.pal(t, nil, "run", "start", "--workflow", wf, "--budget", `{"maxCostUsd":2}`)
	require.Equal(t, 2, r.code, "%s", r)
	require.Contains(t, r.stderr, "budget: ")
	r = b.pal(t, nil, "run", "start", "--workflow", wf, "--budget", `{"maxCostUsd":2}`, "--json")
	require.Equal(t, 2, r.code, "%s", r)
	m := decodeJSON[map[string]any](t, r.stdout)
	require.Equal(t, "bad_input", m["error"], "%s", r)
	require.Equal(t, "budget", m["field"], "%s", r)
	require.Equal(t, before, b.journal(t), "a refused start wrote something")

	r = b.pal(t, nil, "run", "start", "--workflow", wf, "--budget", `{"maxCostUsd":0.00001}`, "--wait")
	require.Equal(t, 0, r.code, "%s", r)
	id := strings.Fields(r.stdout)[0]
	r = b.pal(t, nil, "run", "get", id, "--journal")
	require.Equal(t, 0, r.code, "%s", r)
	require.Regexp(t, `(?m)^Budget\s+\$0\.0000 of \$0\.00001 \(on exceed: fail\)$`, r.stdout)
}

// TestInterruptedFollowSaysTheRunGoesOn: a signal that stops pal run start
// --wait or pal run watch stops the following, not the run: exit 130, a
// line that says the run goes on and how to follow it again, and the run
// then succeeds.
func TestInterruptedFollowSaysTheRunGoesOn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	hold := b.LLM.Hold(nil)
	t.Cleanup(hold.Release)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	env := []string{"PAL_NATS_URL=" + b.NATS.URL()}

	start := testenv.StartProcess(t, b.bin, []string{"run", "start", "--workflow", b.file(t, "held.json", seqWorkflow(1)), "--input", `{"text":"x"}`, "--wait"}, env)
	require.NoError(t, start.WaitForOutput(ctx, "step_started"))
	runID := strings.TrimSpace(strings.SplitN(start.Output(), "\n", 2)[0])
	require.NoError(t, event.ValidateRunID(runID), start.Output())
	watch := testenv.StartProcess(t, b.bin, []string{"run", "watch", runID}, env)
	require.NoError(t, watch.WaitForOutput(ctx, "watching run "+runID))

	for _, p := range []*testenv.Process{start, watch} {
		require.NoError(t, p.Term())
		var ee *exec.ExitError
		require.ErrorAs(t, p.Wait(ctx), &ee, p.Output())
		require.Equal(t, 130, ee.ExitCode(), p.Output())
		require.Contains(t, p.Output(), "stopped following run "+runID+"; the run goes on (pal run watch "+runID, p.Output())
		require.NotContains(t, p.Output(), "context canceled")
	}
	hold.Release()
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, runID).Kind, "the run went on")
}

func runIDs(l runs.RunList) []string {
	var ids []string
	for _, r := range l.Runs {
		ids = append(ids, r.RunID)
	}
	return ids
}

// TestRunWatchPrintsTheTextAsItStreams: pal run watch prints an LLM
// step's text under it as the model writes it: started in the middle of
// a held step it first prints the text so far, then the rest, all of it
// before the step's step_completed line.
func TestRunWatchPrintsTheTextAsItStreams(t *testing.T) {
	t.Parallel()
	b := setup(t)
	words := make([]string, 30)
	for i := range words {
		words[i] = fmt.Sprintf("w%d", i)
	}
	answer := strings.Join(words, " ")
	b.LLM.SetResponder(func(providertest.Call) providertest.Reply {
		return providertest.Reply{Text: answer, Reasoning: "let me think"}
	})
	hold := b.LLM.HoldAfter(nil, 12)
	id := b.start(t, seqWorkflow(1), `{"text":"stream"}`)
	_, err := hold.Wait(ctxFor(t))
	require.NoError(t, err)
	watch := testenv.StartProcess(t, b.bin, []string{"run", "watch", id}, hermetic("PAL_NATS_URL="+b.NATS.URL()))
	// The text so far, read from PAL_DELTAS: the watch is following.
	require.NoError(t, watch.WaitForOutput(ctxFor(t), gutter("│")+"w0 w1"), watch.Output())
	hold.Release()
	require.NoError(t, watch.Wait(ctxFor(t)), watch.Output())
	out := watch.Output()
	require.Contains(t, out, gutter("┊")+"let me think\n", "thinking, apart")
	require.Contains(t, out, gutter("│")+answer+"\n", "the whole text, in order, once, on its gutter")
	text := strings.Index(out, gutter("│")+answer)
	completed := regexp.MustCompile(`(?m)^\s+\d+\s+\S+\s+step_completed\s+s1\s`).FindStringIndex(out)
	require.NotNil(t, completed, out)
	require.Less(t, text, completed[0], "the text before the step's end")
}

func gutter(g string) string { return "      " + g + " " }

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}
