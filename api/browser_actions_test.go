package api_test

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/api"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/receipt"
	"github.com/palrun/pal/workers"
)

// viewerToken (named "viewer") has scope read only.
const viewerToken = "viewer-token-0123456789"

// runCreated is the run's run_created payload.
func runCreated(t *testing.T, b *bundle, id string) event.RunCreatedData {
	t.Helper()
	var d event.RunCreatedData
	require.NoError(t, b.Events(t, id)[0].DecodeData(&d))
	return d
}

// openedRun is the id of the run whose page the browser has open.
func openedRun(br *browser) string {
	return eval[string](br, `document.querySelector('meta[name="pal-run"]').content`)
}

// on is br failing t, a subtest, instead of the test that opened it.
func (br *browser) on(t *testing.T) *browser { return &browser{t: t, ctx: br.ctx} }

// refusedJS finds what shows a refused action: the run page's action
// answer, or the start form's error line.
const refusedJS = `document.querySelector('#action-result[data-outcome="refused"], #start-error:not([hidden])')`

// waitDone waits for an action's effect in the page, failing at once
// with the page's answer when the action was refused.
func (br *browser) waitDone(what, expr string) {
	br.t.Helper()
	br.waitJS(what, fmt.Sprintf(`(%s) || !!%s`, expr, refusedJS))
	require.True(br.t, eval[bool](br, expr), "%s: the page says %q", what, eval[string](br, `(e => e ? e.textContent : "")(`+refusedJS+`)`))
}

// relogin logs the browser out and in again at path with token.
func (br *browser) relogin(b *bundle, path, token string) {
	br.t.Helper()
	br.do(chromedp.Click(chromedp.CSS("#logout")))
	br.waitJS("the login form", `location.pathname === "/login"`)
	br.loginAt(b, path, token)
}

// TestBrowserActions operates runs from the web UI, each action through
// its REST route with the session's CSRF token, and finds its effect in
// the journal: start a deployed workflow from the workflows page's form;
// fork from a chosen step; retry a failed run; resume a run whose lease
// a frozen worker holds (refused for the token, forced with admin, the
// only session shown "force"); raise a budget; send a signal to a
// waiting wait node, whose signal name the page shows; verify the signed
// receipt, and see why an unsigned one is not. Each action's POST with
// the session cookie but without the CSRF token is refused, and a
// read-only session sees no action buttons.
func TestBrowserActions(t *testing.T) {
	_, priv, err := ed25519.GenerateKey(nil)
	require.NoError(t, err)
	key := receipt.NewKey(priv)
	b := setup(t, withTokens([]api.Token{{Name: "ci", Secret: testToken}, {Name: "lead", Secret: adminToken, Scopes: api.ScopeAdmin},
		{Name: "viewer", Secret: viewerToken, Scopes: api.ScopeRead}}, false),
		withHandler(func(c *api.HandlerConfig) { c.Keys = &receipt.Keys{Current: key} }))
	boom := func(context.Context, json.RawMessage) (json.RawMessage, error) {
		return nil, &workers.ToolError{Err: errors.New("boom: the service said no")}
	}
	b.Worker(t, "w1", paltest.Tools(map[string]workers.Tool{"boom": boom}))
	ctx := context.Background()

	const greet = `{"name":"greet","nodes":[{"id":"start","type":"trigger"},
	  {"id":"a","type":"tool","data":{"tool":"echo","input":{"who":"{{input.who}}"}}},
	  {"id":"b","type":"tool","data":{"tool":"echo","input":{"n":2}}}],
	  "edges":[{"from":"start","to":"a"},{"from":"a","to":"b"}]}`
	b.Deploy(t, greet)
	const failing = `{"name":"failing","nodes":[{"id":"start","type":"trigger"},
	  {"id":"ok","type":"tool","data":{"tool":"echo","input":{"n":1}}},
	  {"id":"bad","type":"tool","data":{"tool":"boom","input":{}}}],
	  "edges":[{"from":"start","to":"ok"},{"from":"ok","to":"bad"}]}`
	failed := b.Start(t, failing, `{}`)
	budgeted := strings.Replace(waitGoWorkflow, `"name":"wait-go",`, `"name":"wait-go","policy":{"budget":{"maxSteps":10}},`, 1)
	held := b.Start(t, budgeted, `{}`)
	stuck := b.Start(t, waitGoWorkflow, `{}`)
	for _, id := range []string{held, stuck} {
		b.WaitFor(t, id, "the wait", func(ev event.Event) bool { return ev.Kind == event.StepWaiting })
	}
	require.Equal(t, event.RunFailed, b.WaitEnd(t, failed).Kind)

	t.Run("csrf", func(t *testing.T) {
		c := sessionOf(t, b.login(t, testToken, "/"))
		for _, id := range []string{held, stuck} {
			require.Eventually(t, func() bool { h, err := b.Leases.Holder(ctx, id); return err == nil && h == "" }, 30*time.Second, 10*time.Millisecond)
		}
		before := b.journalState(t)
		for _, p := range []struct{ path, body string }{
			{"/v1/runs", `{"workflow":"greet","input":{}}`},
			{"/v1/runs/" + failed + "/fork", `{"from":"ok"}`},
			{"/v1/runs/" + failed + "/retry", `{}`},
			{"/v1/runs/" + stuck + "/resume", `{}`},
			{"/v1/runs/" + stuck + "/budget", `{"add_steps":1}`},
			{"/v1/runs/" + stuck + "/signals/go", `{}`},
		} {
			m := requireError(t, b.post(t, p.path, p.body, "Authorization", "", "Cookie", c.String()), http.StatusForbidden, "forbidden")
			require.Contains(t, m["detail"], api.CSRFHeader, "%s", p.path)
		}
		require.Equal(t, before, b.journalState(t), "refused requests write nothing")

		// The pages render the start form for a session with scope start.
		for _, path := range []string{"/", "/workflows"} {
			status, body, _ := b.page(t, path, c)
			require.Equal(t, http.StatusOK, status)
			require.Contains(t, body, `<form id="start-form"`, "%s", path)
			require.Contains(t, body, `<script src="/ui/start.js" defer></script>`, "%s", path)
		}
	})

	br := newBrowser(t)
	br.loginAt(b, "/workflows", testToken)

	var started string
	t.Run("start", func(t *testing.T) {
		br := br.on(t)
		require.True(t, eval[bool](br, `!!document.querySelector('#start')`), "a session with scope start has the form")
		br.waitJS("the workflow listed", `!!document.querySelector('tr.workflow[data-name="greet"] a')`)
		// Opening the workflow picks it in the form once its definition is
		// shown; the form is opened after that, so the page no longer
		// changes under the second click.
		br.do(chromedp.Click(chromedp.CSS(`tr.workflow[data-name="greet"] a`)))
		br.waitJS("greet shown", `document.querySelector('#definition-title').textContent.startsWith("greet@")`)
		br.do(chromedp.Click(chromedp.CSS(`#start summary`)))
		br.waitJS("the form, greet picked", `document.querySelector('#start').open && document.querySelector('#start-workflow').value === "greet"`)
		// An input that is not JSON is refused in the form; no run starts.
		br.do(chromedp.SetValue(chromedp.CSS(`#start-input`), `{"who":`), chromedp.Click(chromedp.CSS(`#start-submit`)))
		br.waitJS("the input refused", `!document.querySelector('#start-error').hidden && document.querySelector('#start-error').textContent.includes("not JSON")`)
		br.do(chromedp.SetValue(chromedp.CSS(`#start-input`), `{"who":"<b>ann</b>"}`))
		br.screenshot(t, "start-form")
		br.do(chromedp.Click(chromedp.CSS(`#start-submit`)))
		br.waitDone("the new run's page", `location.pathname.startsWith("/runs/") && document.body.dataset.status === "succeeded"`)
		started = openedRun(br)
		d := runCreated(t, b, started)
		require.Equal(t, "greet", d.WorkflowName)
		require.JSONEq(t, `{"who":"<b>ann</b>"}`, string(d.Input))
		require.Equal(t, "ci", b.Events(t, started)[0].WorkerID, "the session's token starts it")
		br.screenshot(t, "started")
	})

	t.Run("fork", func(t *testing.T) {
		br := br.on(t)
		require.NotEmpty(t, started)
		br.waitJS("the fork picker", `!document.querySelector('#fork-wrap').hidden && [...document.querySelector('#fork-from').options].some(o => o.value === "b")`)
		br.do(chromedp.SetValue(chromedp.CSS(`#fork-from`), "b"))
		br.screenshot(t, "fork")
		br.do(chromedp.Click(chromedp.CSS(`#fork`)))
		br.waitDone("the fork's page", fmt.Sprintf(`location.pathname.startsWith("/runs/") && location.pathname !== "/runs/%s" && document.body.dataset.status === "succeeded"`, started))
		fork := openedRun(br)
		d := runCreated(t, b, fork)
		require.NotNil(t, d.ForkedFrom)
		require.Equal(t, started, d.ForkedFrom.RunID)
		require.Equal(t, "b", d.ForkedFrom.StepID)
		require.Contains(t, eval[string](br, `document.querySelector('#run-meta .forked').textContent`), "forked from "+started+" at b")
	})

	t.Run("retry", func(t *testing.T) {
		br := br.on(t)
		br.do(chromedp.Navigate(b.url + "/runs/" + failed))
		br.waitJS("the retry button", `document.body.dataset.status === "failed" && !document.querySelector('#retry').hidden`)
		require.True(t, eval[bool](br, `document.querySelector('#resume').hidden`), "an ended run is not resumed")
		br.screenshot(t, "retry")
		br.do(chromedp.Click(chromedp.CSS(`#retry`)))
		br.waitDone("the retry's page", fmt.Sprintf(`location.pathname !== "/runs/%s" && document.body.dataset.status === "failed"`, failed))
		d := runCreated(t, b, openedRun(br))
		require.NotNil(t, d.ForkedFrom)
		require.Equal(t, failed, d.ForkedFrom.RunID)
		require.Equal(t, "bad", d.ForkedFrom.StepID, "a retry forks from the first failed step")
	})

	t.Run("budget", func(t *testing.T) {
		br := br.on(t)
		br.do(chromedp.Navigate(b.url + "/runs/" + held))
		br.waitJS("the budget button", `document.body.dataset.status === "waiting" && !document.querySelector('#budget-open').hidden`)
		br.do(chromedp.Click(chromedp.CSS(`#budget-open`)))
		br.waitJS("the budget form", `!document.querySelector('#budget').hidden`)
		// An add to a limit the run does not have is the API's 400.
		br.do(chromedp.SetValue(chromedp.CSS(`#add-usd`), "1"), chromedp.Click(chromedp.CSS(`#budget-submit`)))
		br.waitJS("the refusal", `document.querySelector('#action-result').dataset.outcome === "refused" && document.querySelector('#action-result').textContent.includes("no such limit")`)
		br.do(chromedp.SetValue(chromedp.CSS(`#add-usd`), ""), chromedp.SetValue(chromedp.CSS(`#add-steps`), "5"))
		br.screenshot(t, "budget")
		br.do(chromedp.Click(chromedp.CSS(`#budget-submit`)))
		br.waitDone("the raise", `document.querySelector('#action-result').textContent.includes("Budget raised")`)
		ev := b.WaitFor(t, held, "budget_raised", func(ev event.Event) bool { return ev.Kind == event.BudgetRaised })
		var d event.BudgetRaisedData
		require.NoError(t, ev.DecodeData(&d))
		require.Equal(t, event.BudgetRaisedData{AddSteps: 5, By: "ci"}, d)
	})

	t.Run("signal", func(t *testing.T) {
		br := br.on(t)
		br.waitJS("the signal box", `!!document.querySelector('#signals .signal[data-step="hold"] button.send')`)
		require.Equal(t, "Step hold waits for signal go", eval[string](br, `document.querySelector('#signals .signal h3').textContent`))
		br.do(chromedp.SetValue(chromedp.CSS(`#signals .payload`), `{"n":7}`))
		br.screenshot(t, "signal")
		br.do(chromedp.Click(chromedp.CSS(`#signals button.send`)))
		br.waitDone("the run's end", `document.body.dataset.status === "succeeded" && document.querySelector('#signals').hidden`)
		ev := b.WaitFor(t, held, "signal_received", func(ev event.Event) bool { return ev.Kind == event.SignalReceived })
		var d event.SignalReceivedData
		require.NoError(t, ev.DecodeData(&d))
		require.Equal(t, "go", d.Signal)
		require.JSONEq(t, `{"n":7}`, string(d.Payload))
		require.Equal(t, "ci", d.By)
	})

	t.Run("verify", func(t *testing.T) {
		br := br.on(t)
		// Not signed yet: the page says why the receipt is not verified.
		br.waitJS("the verify button", `!document.querySelector('#verify').hidden`)
		br.do(chromedp.Click(chromedp.CSS(`#verify`)))
		br.waitJS("no receipt", `document.querySelector('#action-result').dataset.outcome === "refused" && document.querySelector('#action-result').textContent.includes("Receipt not verified: run " + document.querySelector('meta[name="pal-run"]').content + " has ended but is not signed yet")`)
		rs, err := receipt.Open(ctx, b.JS, b.Store)
		require.NoError(t, err)
		rec, err := rs.Ensure(ctx, key, held)
		require.NoError(t, err)
		br.do(chromedp.Click(chromedp.CSS(`#verify`)))
		br.waitDone("the verified receipt", `document.querySelector('#action-result').dataset.outcome === "done"`)
		got := eval[string](br, `document.querySelector('#action-result').textContent`)
		require.Contains(t, got, "Receipt verified: signed by key "+key.ID)
		require.Contains(t, got, fmt.Sprintf("%d events, chain head %s", rec.Events, rec.JournalDigest))
		br.screenshot(t, "verify")
	})

	t.Run("resume", func(t *testing.T) {
		br := br.on(t)
		require.Eventually(t, func() bool { h, err := b.Leases.Holder(ctx, stuck); return err == nil && h == "" }, 30*time.Second, 10*time.Millisecond)
		// A frozen worker holds the run's lease, and renews it until it is
		// broken.
		ls, err := b.Leases.Acquire(ctx, stuck, "frozen-7")
		require.NoError(t, err)
		rctx, stop := context.WithCancel(ctx)
		renewed := make(chan struct{})
		go func() {
			defer close(renewed)
			for rctx.Err() == nil && b.Leases.Renew(rctx, ls) == nil {
				select {
				case <-rctx.Done():
				case <-time.After(b.TTL / 5):
				}
			}
		}()
		defer func() { stop(); <-renewed }()
		br.do(chromedp.Navigate(b.url + "/runs/" + stuck))
		br.waitJS("the resume button", `document.body.dataset.status === "waiting" && !document.querySelector('#resume').hidden`)
		require.False(t, eval[bool](br, `!!document.querySelector('#force')`), "force is for admin only")
		br.do(chromedp.Click(chromedp.CSS(`#resume`)))
		br.waitJS("the refusal", `document.querySelector('#action-result').dataset.outcome === "refused" && document.querySelector('#action-result').textContent.includes("held by frozen-7")`)
		br.screenshot(t, "resume-refused")

		before := len(b.Events(t, stuck))
		br.relogin(b, "/runs/"+stuck, adminToken)
		br.waitJS("force, for admin", `!document.querySelector('#resume').hidden && !document.querySelector('#force-wrap').hidden`)
		br.do(chromedp.Click(chromedp.CSS(`#force`)), chromedp.Click(chromedp.CSS(`#resume`)))
		br.waitDone("the forced resume", `document.querySelector('#action-result').textContent.includes("breaking the lease of frozen-7")`)
		br.screenshot(t, "resume-forced")
		require.Contains(t, eval[string](br, `document.querySelector('#action-result').textContent`), "taken by w1")
		// The worker took the run, found it still waiting for its signal
		// and let go: the frozen worker's lease is gone, nothing written.
		require.Eventually(t, func() bool {
			h, err := b.Leases.Holder(ctx, stuck)
			return err == nil && h == ""
		}, 30*time.Second, 10*time.Millisecond)
		require.Len(t, b.Events(t, stuck), before)
	})

	t.Run("read-only", func(t *testing.T) {
		br := br.on(t)
		br.relogin(b, "/runs/"+stuck, viewerToken)
		br.waitJS("the signal box", `document.body.dataset.status === "waiting" && !!document.querySelector('#signals .signal[data-step="hold"]')`)
		for _, sel := range []string{"#retry", "#resume", "#force", "#fork", "#budget-open", "#budget", "#signals button", "#cancel:not([hidden])", "#start"} {
			require.False(t, eval[bool](br, fmt.Sprintf(`!!document.querySelector(%q)`, sel)), "%s is absent for scope read", sel)
		}
		require.Equal(t, "Step hold waits for signal go", eval[string](br, `document.querySelector('#signals .signal h3').textContent`))
		br.screenshot(t, "read-only")
		br.do(chromedp.Navigate(b.url + "/workflows"))
		br.waitJS("the workflows", `!!document.querySelector('tr.workflow[data-name="greet"]')`)
		require.False(t, eval[bool](br, `!!document.querySelector('#start')`), "no start form for scope read")
		br.do(chromedp.Navigate(b.url + "/"))
		br.waitJS("the runs list", `location.pathname === "/" && !!document.querySelector('#user')`)
		require.False(t, eval[bool](br, `!!document.querySelector('#start')`), "no start form for scope read")
	})

	t.Run("narrow", func(t *testing.T) {
		br := br.on(t)
		br.relogin(b, "/runs/"+stuck, adminToken)
		br.do(chromedp.EmulateViewport(800, 900))
		br.waitJS("the narrow page with its actions", `window.innerWidth === 800 && !document.querySelector('#resume').hidden && !!document.querySelector('#signals button.send')`)
		br.do(chromedp.Click(chromedp.CSS(`#budget-open`)))
		br.waitJS("the budget form", `!document.querySelector('#budget').hidden`)
		require.True(t, eval[bool](br, `document.documentElement.scrollWidth <= window.innerWidth`), "no sideways scroll at 800 px")
		br.screenshot(t, "actions-800")
	})
}
