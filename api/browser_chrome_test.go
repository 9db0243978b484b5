package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/paltest/testenv"
	"github.com/palrun/pal/projections"
	"github.com/palrun/pal/provider/providertest"
	"github.com/palrun/pal/runs"
	"github.com/palrun/pal/workers"
)

// The web UI in headless Chromium, against a real PAL: NATS, a worker,
// the API server and (for the runs list) Postgres. Each test saves a
// screenshot of each page it checks under its artifact directory (go
// test -artifacts -outputdir DIR keeps them; the log names the path).
// The tests are not parallel: each runs its own browser, and the machine
// they run on may have two cores.

// browser is one headless Chromium driven over the DevTools protocol.
type browser struct {
	t   testing.TB
	ctx context.Context
}

func newBrowser(t testing.TB) *browser {
	t.Helper()
	path := testenv.Chromium(t)
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox,
		chromedp.WindowSize(1400, 900))
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	// The first run starts the browser; it lives as long as ctx.
	if err := chromedp.Do(ctx); err != nil {
		cancel()
		acancel()
		t.Fatalf("starting Chromium %s: %v", path, err)
	}
	t.Cleanup(func() {
		_ = chromedp.Cancel(ctx)
		cancel()
		acancel()
	})
	return &browser{t: t, ctx: ctx}
}

// do runs steps within 30 seconds.
func (br *browser) do(steps ...chromedp.Action[chromedp.Void]) {
	br.t.Helper()
	ctx, cancel := context.WithTimeout(br.ctx, 30*time.Second)
	defer cancel()
	require.NoError(br.t, chromedp.Do(ctx, steps...))
}

// eval evaluates a JavaScript expression in the page.
func eval[T any](br *browser, expr string) T {
	br.t.Helper()
	ctx, cancel := context.WithTimeout(br.ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	require.NoError(br.t, err, "evaluating %s", expr)
	return v
}

// waitJS waits up to a minute for a JavaScript expression to be true.
func (br *browser) waitJS(what, expr string) {
	br.t.Helper()
	ctx, cancel := context.WithTimeout(br.ctx, 60*time.Second)
	defer cancel()
	for {
		_, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingInterval(20*time.Millisecond)))
		if err == nil {
			return
		}
		// A navigation under way ends the poll of the page it left:
		// poll the next one.
		if ctx.Err() != nil || !(strings.Contains(err.Error(), "navigated") || strings.Contains(err.Error(), "Cannot find context")) {
			require.NoError(br.t, err, "waiting for %s (%s)", what, expr)
		}
	}
}

// clickJS clicks the element sel names from inside the page, waiting
// until there is one: one step, where a mouse click finds the node, then
// its box, then clicks, and fails if the page redrew it in between (as a
// resized waterfall does). A dispatched event, as SVG elements have no
// click().
func (br *browser) clickJS(sel string) {
	br.t.Helper()
	q, err := json.Marshal(sel)
	require.NoError(br.t, err)
	br.waitJS("a click on "+sel, `(() => { const e = document.querySelector(`+string(q)+`); if (!e) return false; e.dispatchEvent(new MouseEvent("click", {bubbles: true, cancelable: true, view: window})); return true })()`)
}

// screenshot saves the whole page as name.png in the test's artifact
// directory.
func (br *browser) screenshot(t *testing.T, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(br.ctx, 30*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	path := filepath.Join(t.ArtifactDir(), name+".png")
	require.NoError(t, os.WriteFile(path, png, 0o644))
	t.Logf("screenshot: %s (%d bytes)", path, len(png))
}

// loginAt opens path, is sent to the login form, logs in with token and
// lands back on path.
func (br *browser) loginAt(b *bundle, path, token string) {
	br.t.Helper()
	br.do(chromedp.Navigate(b.url+path), chromedp.WaitVisible(chromedp.CSS("#token")))
	br.do(chromedp.SendKeys(chromedp.CSS("#token"), token), chromedp.Click(chromedp.CSS("#login")))
	br.waitJS("the page after the login", fmt.Sprintf("location.pathname === %q && !!document.querySelector('#user')", path))
}

// gateTool blocks until release is closed or the step's context ends.
func gateTool(release <-chan struct{}) workers.Tool {
	return func(ctx context.Context, in json.RawMessage) (json.RawMessage, error) {
		select {
		case <-release:
			return json.RawMessage(`{"released":true}`), nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func TestBrowserRunsList(t *testing.T) {
	pool := migratedPool(t)
	ctx := context.Background()
	b := setup(t, withRuns(projections.NewReader(pool)))
	b.Worker(t, "w1")
	p := b.project(t, pool)
	ai := b.Start(t, seqWorkflow(2), `{"topic":"a"}`)
	started, err := runs.New(b.Store).Start(ctx, runs.StartCommand{Rights: runs.AllRights, Workflow: json.RawMessage(echoWorkflow),
		Input: json.RawMessage(`{"x":1}`), Labels: map[string]string{"customer": "acme"}})
	require.NoError(t, err)
	echo := started.RunID
	b.WaitEnd(t, ai)
	b.WaitEnd(t, echo)
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	require.NoError(t, p.WaitCaughtUp(wctx))

	br := newBrowser(t)
	// A wrong token stays on the login form with an error.
	br.do(chromedp.Navigate(b.url+"/"), chromedp.WaitVisible(chromedp.CSS("#token")))
	br.do(chromedp.SendKeys(chromedp.CSS("#token"), "not-a-token"), chromedp.Click(chromedp.CSS("#login")))
	br.waitJS("the login error", "!!document.querySelector('#login-error')")
	br.loginAt(b, "/", testToken)
	br.waitJS("both runs listed", fmt.Sprintf(`!!document.querySelector('tr[data-run-id=%q]') && !!document.querySelector('tr[data-run-id=%q]')`, ai, echo))

	// Newest first, with the projection's tokens and cost.
	order := eval[[]string](br, `[...document.querySelectorAll('#runs tr')].map(r => r.dataset.runId)`)
	require.Equal(t, []string{echo, ai}, order)
	var v struct {
		Runs []struct {
			RunID string `json:"run_id"`
			Usage struct {
				TotalTokens int64 `json:"total_tokens"`
			} `json:"usage"`
		} `json:"runs"`
	}
	require.NoError(t, json.Unmarshal(b.get(t, "/v1/runs").body, &v))
	requireError(t, b.get(t, "/v1/runs?workflow="+strings.Repeat("w", 257)), http.StatusBadRequest, "bad_input")
	var echoOnly struct {
		Runs []struct {
			RunID string `json:"run_id"`
		} `json:"runs"`
	}
	require.NoError(t, json.Unmarshal(b.get(t, "/v1/runs?workflow=echo").body, &echoOnly))
	require.Len(t, echoOnly.Runs, 1)
	require.Equal(t, echo, echoOnly.Runs[0].RunID)
	require.Len(t, v.Runs, 2)
	require.NotZero(t, v.Runs[1].Usage.TotalTokens, "the ai run used tokens")
	tokens := eval[string](br, fmt.Sprintf(`document.querySelector('tr[data-run-id=%q] .tokens').textContent`, ai))
	require.Equal(t, fmt.Sprint(v.Runs[1].Usage.TotalTokens), tokens)
	require.Contains(t, eval[string](br, `document.querySelector('#counts').textContent`), "succeeded 2")
	br.screenshot(t, "runs-list")

	// Sorted by cost, descending, then ascending: the ai run costs more.
	br.do(chromedp.Click(chromedp.CSS(`button.sort[data-sort="cost"]`)))
	br.waitJS("by cost, descending", fmt.Sprintf(`document.querySelector('#runs tr').dataset.runId === %q`, ai))
	require.Contains(t, eval[string](br, `location.search`), "sort=-cost")
	br.do(chromedp.Click(chromedp.CSS(`button.sort[data-sort="cost"]`)))
	br.waitJS("by cost, ascending", fmt.Sprintf(`document.querySelector('#runs tr').dataset.runId === %q`, echo))
	br.do(chromedp.Click(chromedp.CSS(`button.sort[data-sort="duration"]`)))
	br.waitJS("by duration", `document.querySelector('button.sort[data-sort="duration"]').dataset.dir === "desc"`)

	// The label filter and a time range ask the server.
	br.do(chromedp.SendKeys(chromedp.CSS("#label"), "customer=acme"), chromedp.Click(chromedp.CSS("#filters button")))
	br.waitJS("only the labelled run", fmt.Sprintf(`document.querySelectorAll('#runs tr').length === 1 && !!document.querySelector('tr[data-run-id=%q]')`, echo))
	require.Contains(t, eval[string](br, `location.search`), "label=customer%3Dacme")
	eval[chromedp.Void](br, `document.querySelector('#label').value = ''`)
	eval[chromedp.Void](br, `document.querySelector('#since').value = '2000-01-01T00:00:00'; document.querySelector('#until').value = '2000-01-02T00:00:00'`)
	br.do(chromedp.Click(chromedp.CSS("#filters button")))
	br.waitJS("no run in 2000", `document.querySelectorAll('#runs tr').length === 0`)
	eval[chromedp.Void](br, `document.querySelector('#since').value = ''; document.querySelector('#until').value = ''`)

	// The workflow filter asks the server; the search filters by id.
	br.do(chromedp.SendKeys(chromedp.CSS("#workflow"), "echo"), chromedp.Click(chromedp.CSS("#filters button")))
	br.waitJS("only the echo run", fmt.Sprintf(`document.querySelectorAll('#runs tr').length === 1 && !!document.querySelector('tr[data-run-id=%q]')`, echo))
	// A whole run id opens its run.
	eval[chromedp.Void](br, `document.querySelector('#workflow').value = ''`)
	br.do(chromedp.SendKeys(chromedp.CSS("#search"), ai), chromedp.Click(chromedp.CSS("#filters button")))
	br.waitJS("the run's page", fmt.Sprintf("location.pathname === %q", "/runs/"+ai))
	// Listed or not.
	br.do(chromedp.Navigate(b.url + "/"))
	br.waitJS("both runs listed", fmt.Sprintf(`!!document.querySelector('tr[data-run-id=%q]')`, echo))
	br.do(chromedp.SendKeys(chromedp.CSS("#search"), echo), chromedp.Click(chromedp.CSS("#filters button")))
	br.waitJS("the listed run's page", fmt.Sprintf("location.pathname === %q", "/runs/"+echo))
}

// journalAttempts is what the journal says of each step's attempts:
// step → outcome of each attempt in order.
func journalAttempts(evs []event.Event) (order []string, outcomes map[string][]string, starts map[string][]time.Time) {
	outcomes, starts = map[string][]string{}, map[string][]time.Time{}
	for _, ev := range evs {
		switch ev.Kind {
		case event.StepStarted:
			if _, ok := outcomes[ev.StepID]; !ok {
				order = append(order, ev.StepID)
			}
			outcomes[ev.StepID] = append(outcomes[ev.StepID], "running")
			starts[ev.StepID] = append(starts[ev.StepID], ev.TS)
		case event.StepCompleted, event.StepFailed, event.StepRetrying:
			o := outcomes[ev.StepID]
			o[len(o)-1] = map[event.Kind]string{event.StepCompleted: "completed", event.StepFailed: "failed", event.StepRetrying: "retried"}[ev.Kind]
		}
	}
	return order, outcomes, starts
}

// xss is a step output that would run script if the page wrote it as
// markup.
const xss = `<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">`

func TestBrowserFinishedWaterfall(t *testing.T) {
	b := setup(t)
	b.Worker(t, "w1", paltest.Tools(map[string]workers.Tool{"flaky": flakyTool(3)}))
	wf := fmt.Sprintf(`{"name":"finished","nodes":[{"id":"start","type":"trigger"},
	  {"id":"a","type":"tool","data":{"tool":"echo","input":{"n":1}}},
	  {"id":"f","type":"tool","data":{"tool":"flaky","input":{},"retry":{"maxAttempts":6,"backoffMs":60,"retryableClasses":["tool"]}}},
	  {"id":"x","type":"tool","data":{"tool":"echo","input":{"html":%q}}}],
	  "edges":[{"from":"start","to":"a"},{"from":"a","to":"f"},{"from":"f","to":"x"}]}`, xss)
	id := b.Start(t, wf, `{}`)
	b.WaitEnd(t, id)
	evs := b.Events(t, id)

	br := newBrowser(t)
	br.loginAt(b, "/runs/"+id, testToken)
	br.waitJS("the finished waterfall", `document.body.dataset.status === "succeeded" && document.querySelectorAll('.wf-row').length > 0`)

	// One row per step in journal order, one bar per attempt coloured by
	// its outcome, placed where the journal says it started.
	order, outcomes, starts := journalAttempts(evs)
	type bar struct {
		Attempt string  `json:"attempt"`
		Outcome string  `json:"outcome"`
		Left    float64 `json:"left"`
		Width   float64 `json:"width"`
	}
	type row struct {
		Step string `json:"step"`
		Bars []bar  `json:"bars"`
	}
	rows := eval[[]row](br, `[...document.querySelectorAll('.wf-row')].map(r => ({step: r.dataset.step,
	  bars: [...r.querySelectorAll('.seg')].map(s => ({attempt: s.dataset.attempt, outcome: s.dataset.outcome,
	    left: parseFloat(s.style.left), width: parseFloat(s.style.width)}))}))`)
	var gotOrder []string
	for _, r := range rows {
		gotOrder = append(gotOrder, r.Step)
	}
	require.Equal(t, order, gotOrder)
	t0, span := evs[0].TS, evs[len(evs)-1].TS.Sub(evs[0].TS)
	for _, r := range rows {
		var got []string
		for i, s := range r.Bars {
			got = append(got, s.Outcome)
			want := 100 * float64(starts[r.Step][i].Sub(t0)) / float64(span)
			require.InDelta(t, want, s.Left, 0.01, "step %s attempt %d starts where the journal says", r.Step, i+1)
			require.Greater(t, s.Width, 0.0)
		}
		require.Equal(t, outcomes[r.Step], got, "step %s", r.Step)
	}
	require.Equal(t, []string{"retried", "retried", "retried", "completed"}, outcomes["f"])
	// Backoff gaps show between the retries.
	f := rows[1].Bars
	for i := 1; i < len(f); i++ {
		require.Greater(t, f[i].Left, f[i-1].Left+f[i-1].Width, "a gap before attempt %d", i+1)
	}
	require.Equal(t, 1, eval[int](br, `document.querySelectorAll('.marker.drive').length`))
	require.Contains(t, eval[string](br, `document.querySelector('.marker.drive').textContent`), "w1")
	br.screenshot(t, "finished-waterfall")

	// A step's output is shown as text: the script in it does not run.
	br.do(chromedp.Click(chromedp.CSS(`.wf-row[data-step="x"] .step-id`)))
	br.waitJS("the step's detail", `!!document.querySelector('#detail pre.output')`)
	out := eval[string](br, `document.querySelector('#detail pre.output').textContent`)
	require.Contains(t, out, "<script>window.__pwned=1</script>")
	require.True(t, eval[bool](br, `window.__pwned === undefined`))
	require.Equal(t, 0, eval[int](br, `document.querySelectorAll('#detail img, #detail script').length`))
	key := eval[string](br, `[...document.querySelectorAll('#detail dt')].find(d => d.textContent === 'Idempotency key').nextSibling.textContent`)
	require.Equal(t, event.IdempotencyKey(id, "x", 1), key)
	br.screenshot(t, "step-detail")
}

// TestBrowserRetriesAndDrives opens a hand-made journal: a step retried
// 50 times, a drive that took over from an interrupted one, and an
// anomaly. (Real backoff grows too fast for a test to wait out 50
// retries.) Tick and marker labels do not overlap, at 800 px either.
func TestBrowserRetriesAndDrives(t *testing.T) {
	b := setup(t)
	id := event.NewRunID()
	t0 := time.Now().UTC().Add(-time.Minute)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	mk := func(ms int, k event.Kind, step string, attempt int, data any) event.Event {
		ev := event.MustNew(k, step, attempt, data)
		ev.TS = at(ms)
		return ev
	}
	key := func(n int) string { return event.IdempotencyKey(id, "r", n) }
	evs := []event.Event{
		mk(0, event.RunCreated, "", 0, event.RunCreatedData{WorkflowName: "hand-made", Input: json.RawMessage(`{}`)}),
		mk(1, event.RunResumed, "", 0, event.RunResumedData{Worker: "w1", ResumeCount: 1}),
	}
	ms := 2
	for n := 1; n <= 50; n++ {
		evs = append(evs, mk(ms, event.StepStarted, "r", n, event.StepStartedData{NodeID: "r", NodeType: "tool", IdempotencyKey: key(n)}),
			mk(ms+10, event.StepRetrying, "r", n, event.StepRetryingData{Attempt: n + 1, Of: 51, Error: "not yet", Class: "tool", DelayMs: 10}))
		ms += 300 // a 15 s axis: ticks every 2 s, as many as fit
		if n == 25 {
			evs = append(evs, mk(ms, event.RunResumed, "", 0, event.RunResumedData{Worker: "w2", ResumeCount: 2, Crashed: true, CrashesAtStep: 1}),
				mk(ms+1, event.AnomalyDetected, "", 0, event.AnomalyDetectedData{Type: "retry_storm", Observed: 25, Threshold: 20, Action: "record", StepID: "r"}),
				mk(ms+2, event.BudgetWarning, "", 0, event.BudgetWarningData{Limit: "max_cost_usd", Spent: 0.8, Max: 1}))
			ms += 3
		}
	}
	evs = append(evs, mk(ms, event.StepStarted, "r", 51, event.StepStartedData{NodeID: "r", NodeType: "tool", IdempotencyKey: key(51)}),
		mk(ms+5, event.StepCompleted, "r", 51, event.StepCompletedData{Output: json.RawMessage(`{"ok":true}`), DurationMs: 5}),
		mk(ms+6, event.RunSucceeded, "", 0, event.RunSucceededData{Output: json.RawMessage(`{"ok":true}`)}))
	b.AppendRaw(t, id, evs...)

	br := newBrowser(t)
	br.loginAt(b, "/runs/"+id, testToken)
	br.waitJS("the waterfall", `document.body.dataset.status === "succeeded"`)
	outcomes := eval[[]string](br, `[...document.querySelectorAll('.wf-row[data-step="r"] .seg')].map(s => s.dataset.outcome)`)
	require.Len(t, outcomes, 51, "50 retries draw 51 bars")
	for i, o := range outcomes[:50] {
		require.Equal(t, "retried", o, "attempt %d", i+1)
	}
	require.Equal(t, "completed", outcomes[50])
	drives := eval[[]string](br, `[...document.querySelectorAll('.marker.drive')].map(m => m.textContent)`)
	require.Equal(t, []string{"drive 1 · w1", "drive 2 · w2 · previous drive interrupted"}, drives)
	require.Equal(t, 1, eval[int](br, `document.querySelectorAll('.marker.interrupted').length`))
	require.Equal(t, 1, eval[int](br, `document.querySelectorAll('.marker.mark[data-kind="anomaly_detected"]').length`))
	// The second drive, the anomaly and the budget warning are a
	// millisecond apart: their labels take lines of their own. No two tick labels overlap either,
	// at 1,400 px nor at 800 px.
	require.Zero(t, eval[int](br, overlapsJS+`overlaps('.marker .label')`), "marker labels overlap")
	require.Zero(t, eval[int](br, overlapsJS+`overlaps('#axis .tick')`), "tick labels overlap")
	br.screenshot(t, "retries-and-drives")
	br.do(chromedp.EmulateViewport(800, 900))
	br.waitJS("the axis drawn at 800 px", `document.documentElement.clientWidth === 800 &&
	  document.body.dataset.axisWidth === String(document.querySelector('#axis').clientWidth)`)
	require.Greater(t, eval[int](br, `document.querySelectorAll('#axis .tick').length`), 1)
	require.Zero(t, eval[int](br, overlapsJS+`overlaps('#axis .tick')`), "tick labels overlap at 800 px")
	require.Zero(t, eval[int](br, overlapsJS+`overlaps('.marker .label')`), "marker labels overlap at 800 px")
	br.screenshot(t, "retries-and-drives-800")
}

// overlapsJS defines overlaps(selector): how many pairs of the elements
// it selects have bounding boxes that overlap.
const overlapsJS = `var overlaps = sel => {
  const b = [...document.querySelectorAll(sel)].map(e => e.getBoundingClientRect());
  let n = 0;
  for (let i = 0; i < b.length; i++) for (let j = i + 1; j < b.length; j++)
    if (b[i].left < b[j].right && b[j].left < b[i].right && b[i].top < b[j].bottom && b[j].top < b[i].bottom) n++;
  return n;
};
`

// TestBrowserChildRun folds a child run's steps out under the step that
// waits for it.
func TestBrowserChildRun(t *testing.T) {
	b := setup(t)
	b.Worker(t, "w1")
	wf := `{"name":"parent","nodes":[{"id":"start","type":"trigger"},
	  {"id":"kid","type":"subagent","data":{"input":{"q":1},"workflow":{"name":"child","nodes":[{"id":"start","type":"trigger"},
	    {"id":"c1","type":"tool","data":{"tool":"echo","input":{"n":1}}},{"id":"ok","type":"approval","data":{"prompt":"child?"}}],
	    "edges":[{"from":"start","to":"c1"},{"from":"c1","to":"ok"}]}}}],
	  "edges":[{"from":"start","to":"kid"}]}`
	id := b.Start(t, wf, `{}`)
	wait := b.WaitFor(t, id, "the wait for the child", func(ev event.Event) bool { return ev.Kind == event.StepWaiting })
	var d event.StepWaitingData
	require.NoError(t, wait.DecodeData(&d))
	child := d.ChildRunID
	require.NotEmpty(t, child)
	b.WaitFor(t, child, "the child's approval wait", func(ev event.Event) bool { return ev.Kind == event.StepWaiting })

	br := newBrowser(t)
	br.loginAt(b, "/runs/"+id, testToken)
	br.waitJS("the subagent step", `!!document.querySelector('.wf-row[data-step="kid"] [data-toggle]')`)
	require.True(t, eval[bool](br, `!!document.querySelector('.wf-row[data-step="kid"] .wait[data-reason="child"]')`), "the wait for the child is hatched")
	require.Equal(t, "/runs/"+child, eval[string](br, `new URL(document.querySelector('.wf-row[data-step="kid"] a.child').href).pathname`))
	br.do(chromedp.Click(chromedp.CSS(`.wf-row[data-step="kid"] [data-toggle]`)))
	br.waitJS("the child's steps", fmt.Sprintf(`document.querySelectorAll('.wf-row[data-run=%q]').length === 2`, child))
	steps := eval[[]string](br, `[...document.querySelectorAll('.wf-row')].map(r => r.dataset.step)`)
	require.Equal(t, []string{"kid", "c1", "ok"}, steps, "the child's steps under the step that waits for it")
	br.screenshot(t, "child-run")

	// The child ends; the parent's page follows it to the end.
	require.Equal(t, http.StatusOK, b.post(t, "/v1/runs/"+child+"/approve", `{"step_id":"ok","decision":"approve"}`).status)
	br.waitJS("the parent's end", fmt.Sprintf(`document.body.dataset.status === "succeeded" && !!document.querySelector('.wf-row[data-run=%q][data-step="ok"] .seg.completed')`, child))
}

// TestBrowserForkedRun: a fork's page links to its source and badges the
// steps it copied.
func TestBrowserForkedRun(t *testing.T) {
	b := setup(t)
	b.Worker(t, "w1")
	wf := `{"name":"two","nodes":[{"id":"start","type":"trigger"},
	  {"id":"a","type":"tool","data":{"tool":"echo","input":{"n":1}}},{"id":"z","type":"tool","data":{"tool":"echo","input":{"n":2}}}],
	  "edges":[{"from":"start","to":"a"},{"from":"a","to":"z"}]}`
	src := b.Start(t, wf, `{}`)
	b.WaitEnd(t, src)
	res := b.post(t, "/v1/runs/"+src+"/fork", `{"from":"z"}`)
	require.Equal(t, http.StatusCreated, res.status, "%s", res.body)
	fork := res.json(t)["run_id"].(string)
	b.WaitEnd(t, fork)

	br := newBrowser(t)
	br.loginAt(b, "/runs/"+fork, testToken)
	br.waitJS("the fork's waterfall", `document.body.dataset.status === "succeeded"`)
	require.Equal(t, "/runs/"+src, eval[string](br, `new URL(document.querySelector('#run-meta a.forked').href).pathname`))
	require.Contains(t, eval[string](br, `document.querySelector('#run-meta a.forked').textContent`), "forked from "+src+" at z")
	require.Equal(t, "/runs/"+src, eval[string](br, `new URL(document.querySelector('.wf-row[data-step="a"] a.copied').href).pathname`))
	require.False(t, eval[bool](br, `!!document.querySelector('.wf-row[data-step="z"] a.copied')`), "z ran again")
	br.screenshot(t, "forked-run")
}

func TestBrowserLiveWaterfall(t *testing.T) {
	b := setup(t)
	release := make(chan struct{})
	b.Worker(t, "w1", paltest.Tools(map[string]workers.Tool{"gate": gateTool(release)}))
	wf := `{"name":"live","nodes":[{"id":"start","type":"trigger"},
	  {"id":"a","type":"tool","data":{"tool":"echo","input":{"n":1}}},
	  {"id":"g","type":"tool","data":{"tool":"gate","input":{}}},
	  {"id":"z","type":"tool","data":{"tool":"echo","input":{"n":2}}}],
	  "edges":[{"from":"start","to":"a"},{"from":"a","to":"g"},{"from":"g","to":"z"}]}`
	id := b.Start(t, wf, `{}`)
	b.WaitFor(t, id, "the gate", func(ev event.Event) bool { return ev.Kind == event.StepStarted && ev.StepID == "g" })

	br := newBrowser(t)
	br.loginAt(b, "/runs/"+id, testToken)
	br.waitJS("the running step", `!!document.querySelector('.wf-row[data-step="g"] .seg.running.open')`)
	require.False(t, eval[bool](br, `!!document.querySelector('.wf-row[data-step="z"]')`))
	require.False(t, eval[bool](br, `document.querySelector('#cancel').hidden`), "a run in flight can be cancelled")
	br.screenshot(t, "live-waterfall")
	// The page must not reload: a mark set now has to survive.
	eval[chromedp.Void](br, `window.__samePage = true`)

	close(release)
	br.waitJS("the new step, drawn from the event stream", `!!document.querySelector('.wf-row[data-step="z"] .seg.completed')`)
	br.waitJS("the end", `document.body.dataset.status === "succeeded"`)
	require.True(t, eval[bool](br, `window.__samePage === true`), "the page updated without a reload")
	require.True(t, eval[bool](br, `document.querySelector('#cancel').hidden`))
	br.screenshot(t, "live-waterfall-done")
}

func TestBrowserApprove(t *testing.T) {
	b := setup(t)
	b.Worker(t, "w1")
	wf := `{"name":"ship","nodes":[{"id":"start","type":"trigger"},
	  {"id":"a","type":"tool","data":{"tool":"echo","input":{"n":1}}},
	  {"id":"ok","type":"approval","data":{"prompt":"Ship version {{input.v}}?","approvers":["ci","ann"]}},
	  {"id":"z","type":"tool","data":{"tool":"echo","input":{"n":2}}}],
	  "edges":[{"from":"start","to":"a"},{"from":"a","to":"ok"},{"from":"ok","to":"z"}]}`
	id := b.Start(t, wf, `{"v":"7"}`)
	b.WaitFor(t, id, "the approval wait", func(ev event.Event) bool { return ev.Kind == event.StepWaiting })

	br := newBrowser(t)
	br.loginAt(b, "/runs/"+id, testToken)
	br.waitJS("the approval box", `!!document.querySelector('.approval[data-step="ok"] button.approve')`)
	require.Equal(t, "Ship version 7?", eval[string](br, `document.querySelector('.approval .prompt').textContent`))
	require.Equal(t, "May decide: ci, ann", eval[string](br, `document.querySelector('.approval .approvers').textContent`))
	br.waitJS("the hatched wait", `!!document.querySelector('.wf-row[data-step="ok"] .wait[data-reason="approval"]')`)
	br.screenshot(t, "waiting-approval")

	br.do(chromedp.SendKeys(chromedp.CSS(".approval .comment"), "looks good"), chromedp.Click(chromedp.CSS(".approval button.approve")))
	br.waitJS("the run going on to its end", `document.body.dataset.status === "succeeded" && !!document.querySelector('.wf-row[data-step="z"] .seg.completed')`)
	require.True(t, eval[bool](br, `document.querySelector('#approvals').hidden`))
	var got event.ApprovalReceivedData
	for _, ev := range b.Events(t, id) {
		if ev.Kind == event.ApprovalReceived {
			require.NoError(t, ev.DecodeData(&got))
		}
	}
	require.Equal(t, event.ApprovalReceivedData{Decision: "approve", Approver: "ci", Comment: "looks good"}, got)
	require.Equal(t, 2, eval[int](br, `document.querySelectorAll('.marker.drive').length`), "the resume after the approval is a second drive")
	br.screenshot(t, "approved")
}

// TestBrowserCancel cancels a run from the page while its step is in
// flight: the run ends cancelled, with a marker, and the step is drawn
// interrupted.
func TestBrowserCancel(t *testing.T) {
	b := setup(t)
	never := make(chan struct{})
	b.Worker(t, "w1", paltest.Tools(map[string]workers.Tool{"gate": gateTool(never)}))
	wf := `{"name":"stuck","nodes":[{"id":"start","type":"trigger"},{"id":"g","type":"tool","data":{"tool":"gate","input":{}}}],
	  "edges":[{"from":"start","to":"g"}]}`
	id := b.Start(t, wf, `{}`)
	b.WaitFor(t, id, "the gate", func(ev event.Event) bool { return ev.Kind == event.StepStarted })

	br := newBrowser(t)
	br.loginAt(b, "/runs/"+id, testToken)
	br.waitJS("the cancel button", `!document.querySelector('#cancel').hidden`)
	br.do(chromedp.Click(chromedp.CSS("#cancel")))
	br.waitJS("the confirmation", `document.querySelector('#cancel').textContent.includes('again')`)
	br.do(chromedp.Click(chromedp.CSS("#cancel")))
	br.waitJS("the cancelled run", `document.body.dataset.status === "cancelled"`)
	end := b.WaitEnd(t, id)
	require.Equal(t, event.RunCancelled, end.Kind)
	var d event.RunCancelledData
	require.NoError(t, end.DecodeData(&d))
	require.Equal(t, "ci", d.By)
	require.Equal(t, "cancelled from the web UI", d.Reason)
	require.Equal(t, 1, eval[int](br, `document.querySelectorAll('.marker.kind-run_cancelled').length`))
	// The gate was in flight when the run ended: interrupted, its bar
	// ending at the run's end, not running.
	br.waitJS("the interrupted gate", `!!document.querySelector('.wf-row.status-interrupted[data-step="g"] .seg.interrupted')`)
	type bar struct {
		Outcome string  `json:"outcome"`
		Open    bool    `json:"open"`
		End     float64 `json:"end"`
	}
	g := eval[bar](br, `(s => ({outcome: s.dataset.outcome, open: s.classList.contains('open'),
	  end: parseFloat(s.style.left) + parseFloat(s.style.width)}))(document.querySelector('.wf-row[data-step="g"] .seg'))`)
	require.Equal(t, "interrupted", g.Outcome)
	require.False(t, g.Open)
	require.InDelta(t, 100, g.End, 0.01, "the bar ends at the run's end")
	require.Zero(t, eval[int](br, `document.querySelectorAll('.seg.running, .wf-row.status-running').length`))
	require.Equal(t, 1, eval[int](br, `document.querySelectorAll('#view-waterfall .legend .sw.interrupted').length`))
	br.screenshot(t, "cancelled")
}

// BenchmarkWaterfall1000 measures opening the waterfall of a finished
// run of 1,000 steps (a loop of 1,000 echo iterations) in Chromium: from
// navigation until all 1,001 rows are drawn, the loop folded out (page
// load, the waterfall request, and the drawing), as the test sees it
// through the DevTools protocol; and in the page, the time from the
// navigation to the first drawing and the time to draw all 1,001 rows.
func BenchmarkWaterfall1000(b *testing.B) {
	bn := setup(b)
	bn.Worker(b, "w1")
	wf := `{"name":"loop-1000","nodes":[{"id":"start","type":"trigger"},
	  {"id":"each","type":"loop","data":{"over":"{{input.items}}","maxIterations":1000,"body":{"name":"one","nodes":[{"id":"start","type":"trigger"},
	    {"id":"t","type":"tool","data":{"tool":"echo","input":{"i":"{{input.item}}"}}}],"edges":[{"from":"start","to":"t"}]}}}],
	  "edges":[{"from":"start","to":"each"}]}`
	items := make([]int, 1000)
	for i := range items {
		items[i] = i
	}
	in, err := json.Marshal(map[string]any{"items": items})
	require.NoError(b, err)
	id := bn.Start(b, wf, string(in))
	bn.WaitEnd(b, id)
	br := newBrowser(b)
	br.loginAt(bn, "/runs/"+id, testToken)
	var total, fetch time.Duration
	var draw, firstDraw float64
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		br.do(chromedp.Navigate(bn.url + "/runs/" + id))
		br.waitJS("the folded loop", `document.querySelectorAll('.wf-row').length === 1`)
		firstDraw += eval[float64](br, `parseFloat(document.body.dataset.drawnAt)`)
		br.do(chromedp.Click(chromedp.CSS("#expand-all")))
		br.waitJS("1,001 rows", `document.querySelectorAll('.wf-row').length === 1001`)
		total += time.Since(start)
		draw += eval[float64](br, `parseFloat(document.body.dataset.drawMs)`)
		b.StopTimer()
		start = time.Now()
		require.Equal(b, http.StatusOK, bn.get(b, "/v1/runs/"+id+"/waterfall").status)
		fetch += time.Since(start)
		b.StartTimer()
	}
	n := float64(b.N)
	b.ReportMetric(float64(total.Microseconds())/1000/n, "ms/load")
	b.ReportMetric(draw/n, "ms/draw-1001-rows")
	b.ReportMetric(firstDraw/n, "ms/navigation-to-first-draw")
	b.ReportMetric(float64(fetch.Microseconds())/1000/n, "ms/waterfall-request")
	if bars := eval[int](br, `document.querySelectorAll('.seg.completed').length`); bars != 1001 {
		b.Fatalf("%d bars drawn, want 1001", bars)
	}
}

// TestBrowserWorkflows: the runs list links to the deployed workflows,
// each at its latest version; a workflow opens its versions, and each
// version its definition, written as text.
func TestBrowserWorkflows(t *testing.T) {
	b := setup(t)
	hostile := `{"name":"triage","nodes":[{"id":"start","type":"trigger"},{"id":"a","type":"tool","data":{"tool":"echo","input":{"note":"<img src=x onerror=alert(1)>"}}}],"edges":[{"from":"start","to":"a"}]}`
	b.Deploy(t, triage(1))
	require.Equal(t, uint64(2), b.Deploy(t, hostile).Version)
	b.Deploy(t, echoWorkflow)

	br := newBrowser(t)
	br.loginAt(b, "/", testToken)
	br.do(chromedp.Click(chromedp.CSS("#nav-workflows")))
	br.waitJS("the workflows", `location.pathname === "/workflows" && document.querySelectorAll('#workflows tr.workflow').length === 2`)
	require.Equal(t, []string{"echo", "triage"}, eval[[]string](br, `[...document.querySelectorAll('#workflows tr.workflow')].map(r => r.dataset.name)`))
	require.Equal(t, "2", eval[string](br, `document.querySelector('tr[data-name="triage"] .latest').textContent`))
	br.screenshot(t, "workflows")

	br.do(chromedp.Click(chromedp.CSS(`tr[data-name="triage"] a`)))
	br.waitJS("triage's versions", `document.querySelectorAll('#versions tr.version').length === 2`)
	require.Equal(t, []string{"2", "1"}, eval[[]string](br, `[...document.querySelectorAll('#versions tr.version')].map(r => r.dataset.version)`))
	require.Contains(t, eval[string](br, `document.querySelector('#definition').textContent`), "<img src=x onerror=alert(1)>",
		"the latest definition, as text")
	require.False(t, eval[bool](br, `!!document.querySelector('#definition img')`), "no markup from a definition")
	br.do(chromedp.Click(chromedp.CSS(`tr.version[data-version="1"] a`)))
	br.waitJS("version 1's definition", `document.querySelector('#definition').textContent.includes('"prompt": "go?"')`)
	require.Contains(t, eval[string](br, `document.querySelector('#definition-title').textContent`), "triage@1")
	br.screenshot(t, "workflow-versions")
}

// TestBrowserStreamingText: an LLM step's answer grows in its row and
// detail panel as the provider writes it (the run page's feed asks for
// deltas), and gives way to the journaled answer once the step completes.
func TestBrowserStreamingText(t *testing.T) {
	b := setup(t, withWorker())
	hold := b.LLM.HoldAfter(func(c providertest.Call) bool { return c.LastUser() == "write slowly please" }, 2)
	t.Cleanup(hold.Release)
	wf := `{"name":"stream","nodes":[{"id":"start","type":"trigger"},
	  {"id":"ask","type":"ai-step","data":{"provider":"openai","model":"gpt-4o-mini","prompt":"write slowly please"}}],
	  "edges":[{"from":"start","to":"ask"}]}`
	id := b.Start(t, wf, `{}`)
	_, err := hold.Wait(t.Context())
	require.NoError(t, err)

	br := newBrowser(t)
	br.loginAt(b, "/runs/"+id, testToken)
	br.waitJS("the text so far in the step's row", `(document.querySelector('.wf-row[data-step="ask"] .stream') || {}).textContent === "echo: write"`)
	br.do(chromedp.Click(chromedp.CSS(`.wf-row[data-step="ask"] .wf-name`)))
	br.waitJS("the text so far in the detail panel", `(document.querySelector('#detail pre.streaming') || {}).textContent === "echo: write"`)
	br.screenshot(t, "streaming-text")

	hold.Release()
	br.waitJS("the end", `document.body.dataset.status === "succeeded"`)
	br.waitJS("the journaled answer in place of the stream", `!document.querySelector('.wf-row[data-step="ask"] .stream') && !document.querySelector('#detail pre.streaming')`)
	require.Contains(t, eval[string](br, `document.querySelector('#detail pre.output').textContent`), "echo: write slowly please")
}
