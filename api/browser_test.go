package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/api"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/runs"
	"github.com/palrun/pal/workers"
)

// The web UI's browser auth over plain HTTP; browser_chrome_test.go
// drives the pages in Chromium.

// noRedirects is a client that shows redirects instead of following them.
func (b *bundle) noRedirects() *http.Client {
	return &http.Client{Timeout: 30 * time.Second, Transport: b.client.Transport,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// login posts the login form and returns the answer.
func (b *bundle) login(t testing.TB, token, next string, headers ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, b.url+"/login", strings.NewReader(url.Values{"token": {token}, "next": {next}}.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	res, err := b.noRedirects().Do(req)
	require.NoError(t, err)
	_ = res.Body.Close()
	return res
}

func sessionOf(t testing.TB, res *http.Response) *http.Cookie {
	t.Helper()
	for _, c := range res.Cookies() {
		if c.Name == api.SessionCookie {
			return c
		}
	}
	t.Fatalf("no %s cookie in %v", api.SessionCookie, res.Header["Set-Cookie"])
	return nil
}

var csrfMeta = regexp.MustCompile(`<meta name="pal-csrf" content="([^"]*)">`)

// page gets a page with the session cookie and returns its body and CSRF
// token.
func (b *bundle) page(t testing.TB, path string, c *http.Cookie) (int, string, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, b.url+path, nil)
	require.NoError(t, err)
	if c != nil {
		req.AddCookie(c)
	}
	res, err := b.noRedirects().Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	if res.StatusCode == http.StatusSeeOther {
		return res.StatusCode, res.Header.Get("Location"), ""
	}
	csrf := ""
	if m := csrfMeta.FindSubmatch(body); m != nil {
		csrf = string(m[1])
	}
	return res.StatusCode, string(body), csrf
}

func TestBrowserSessionLoginAndCSRF(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.Worker(t, "w1")

	// Unauthenticated pages go to the login form, and back after it.
	status, loc, _ := b.page(t, "/", nil)
	require.Equal(t, http.StatusSeeOther, status)
	require.Equal(t, "/login?next=%2F", loc)
	status, loc, _ = b.page(t, "/runs/r1", nil)
	require.Equal(t, http.StatusSeeOther, status)
	require.Equal(t, "/login?next=%2Fruns%2Fr1", loc)
	status, loc, _ = b.page(t, "/workflows", nil)
	require.Equal(t, http.StatusSeeOther, status)
	require.Equal(t, "/login?next=%2Fworkflows", loc)
	status, body, _ := b.page(t, "/login?next=/runs/r1", nil)
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, body, `name="next" value="/runs/r1"`)

	// A wrong token is refused and sets no cookie.
	res := b.login(t, "wrong", "/")
	require.Equal(t, http.StatusUnauthorized, res.StatusCode)
	require.Empty(t, res.Cookies())

	// The right one gets a session cookie with the flags a browser needs.
	res = b.login(t, testToken, "/runs/r1")
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	require.Equal(t, "/runs/r1", res.Header.Get("Location"))
	c := sessionOf(t, res)
	require.True(t, c.HttpOnly)
	require.Equal(t, http.SameSiteStrictMode, c.SameSite)
	require.False(t, c.Secure, "plain HTTP without a trusted proxy")
	require.Equal(t, int(api.DefaultSessionTTL/time.Second), c.MaxAge)
	require.WithinDuration(t, time.Now().Add(api.DefaultSessionTTL), c.Expires, time.Minute)

	status, body, csrf := b.page(t, "/", c)
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, body, `signed in as <b id="user">ci</b>`)
	require.Contains(t, body, `<a href="/workflows" id="nav-workflows">`, "the runs list links to the workflows")
	require.NotEmpty(t, csrf)
	status, body, _ = b.page(t, "/workflows", c)
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, body, `<script src="/ui/workflows.js" defer></script>`)

	// The cookie stands for the token on /v1, reads and event streams too.
	id := b.Start(t, echoWorkflow, `{"x":1}`)
	b.WaitEnd(t, id)
	r := b.get(t, "/v1/runs/"+id+"/waterfall", "Authorization", "", "Cookie", c.String())
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	r = b.get(t, "/v1/runs/"+id+"/events", "Authorization", "", "Cookie", c.String())
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.Contains(t, string(r.body), "event: run_succeeded")

	// A changing request with the cookie needs the session's CSRF token.
	wait := b.Start(t, `{"name":"gate","nodes":[{"id":"start","type":"trigger"},{"id":"ok","type":"approval"}],"edges":[{"from":"start","to":"ok"}]}`, `{}`)
	b.WaitFor(t, wait, "the wait", func(ev event.Event) bool { return ev.Kind == event.StepWaiting })
	before := len(b.Events(t, wait))
	requireError(t, b.post(t, "/v1/runs/"+wait+"/cancel", `{}`, "Authorization", "", "Cookie", c.String()), http.StatusForbidden, "forbidden")
	requireError(t, b.post(t, "/v1/runs/"+wait+"/cancel", `{}`, "Authorization", "", "Cookie", c.String(), api.CSRFHeader, csrf+"x"), http.StatusForbidden, "forbidden")
	require.Len(t, b.Events(t, wait), before, "a refused request writes nothing")
	r = b.post(t, "/v1/runs/"+wait+"/cancel", `{}`, "Authorization", "", "Cookie", c.String(), api.CSRFHeader, csrf)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	end := b.WaitEnd(t, wait)
	var d event.RunCancelledData
	require.NoError(t, end.DecodeData(&d))
	require.Equal(t, "ci", d.By, "the session acts as its token")

	// Bearer tokens work as before, without any cookie or CSRF token.
	require.Equal(t, http.StatusOK, b.get(t, "/v1/runs/"+id).status)

	// Logging out needs the CSRF token too, and ends the session.
	req, err := http.NewRequest(http.MethodPost, b.url+"/logout", strings.NewReader("csrf=nope"))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.AddCookie(c)
	out, err := b.noRedirects().Do(req)
	require.NoError(t, err)
	_ = out.Body.Close()
	require.Equal(t, http.StatusForbidden, out.StatusCode)
	req, err = http.NewRequest(http.MethodPost, b.url+"/logout", strings.NewReader(url.Values{"csrf": {csrf}}.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.AddCookie(c)
	out, err = b.noRedirects().Do(req)
	require.NoError(t, err)
	_ = out.Body.Close()
	require.Equal(t, http.StatusSeeOther, out.StatusCode)
	ended := requireError(t, b.get(t, "/v1/runs/"+id, "Authorization", "", "Cookie", c.String()), http.StatusUnauthorized, "unauthorized")
	require.Contains(t, ended["detail"], "the browser session has ended", "it says why, not that a token is missing")
	status, _, _ = b.page(t, "/", c)
	require.Equal(t, http.StatusSeeOther, status)
}

func TestBrowserSessionHostileInput(t *testing.T) {
	t.Parallel()
	b := setup(t, withHandler(func(hc *api.HandlerConfig) { hc.TrustForwardedProto = true }))

	// The login body is bounded.
	big := strings.Repeat("a", api.MaxLoginBytes+1)
	res := b.login(t, big, "/")
	require.Equal(t, http.StatusRequestEntityTooLarge, res.StatusCode)
	req, err := http.NewRequest(http.MethodPost, b.url+"/login", strings.NewReader("token="+big))
	require.NoError(t, err)
	req.ContentLength = -1 // chunked: the bound holds without a length too
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	out, err := b.noRedirects().Do(req)
	require.NoError(t, err)
	_ = out.Body.Close()
	require.Equal(t, http.StatusRequestEntityTooLarge, out.StatusCode)

	// A login never sends the browser off this server.
	for _, next := range []string{"//evil.example/", "https://evil.example/", "/\\evil.example", "javascript:alert(1)", ""} {
		res := b.login(t, testToken, next)
		require.Equal(t, http.StatusSeeOther, res.StatusCode)
		require.Equal(t, "/", res.Header.Get("Location"), "next %q", next)
	}

	// Behind a TLS proxy the cookie is Secure.
	res = b.login(t, testToken, "/", "X-Forwarded-Proto", "https")
	c := sessionOf(t, res)
	require.True(t, c.Secure)

	// Run ids in page paths are checked before anything is read.
	for _, bad := range []string{"a.b", "a%2A", strings.Repeat("x", 200), "%3Cscript%3E"} {
		status, body, _ := b.page(t, "/runs/"+bad, c)
		require.Equal(t, http.StatusBadRequest, status, bad)
		require.Contains(t, body, "bad run id")
		require.NotContains(t, body, "<script>")
	}
	requireError(t, b.get(t, "/v1/runs/a.b/waterfall"), http.StatusBadRequest, "bad_input")
	requireError(t, b.get(t, "/v1/runs/nope/waterfall"), http.StatusNotFound, "not_found")

	// A forged or oversized cookie is no session.
	for _, v := range []string{"forged", strings.Repeat("z", 4000)} {
		requireError(t, b.get(t, "/v1/runs", "Authorization", "", "Cookie", api.SessionCookie+"="+v), http.StatusUnauthorized, "unauthorized")
	}
}

// TestWaterfallEndpoint checks GET /v1/runs/{id}/waterfall on a run with
// retries, a nested loop, an approval wait and a second drive.
func TestWaterfallEndpoint(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.Worker(t, "w1", paltest.Tools(map[string]workers.Tool{"flaky": flakyTool(2)}))
	wf := `{"name":"mix","nodes":[{"id":"start","type":"trigger"},
	  {"id":"f","type":"tool","data":{"tool":"flaky","input":{},"retry":{"maxAttempts":5,"backoffMs":30,"retryableClasses":["tool"]}}},
	  {"id":"each","type":"loop","data":{"over":"{{input.items}}","body":{"name":"one","nodes":[{"id":"start","type":"trigger"},
	    {"id":"t","type":"tool","data":{"tool":"echo","input":{"i":"{{input.item}}"}}}],"edges":[{"from":"start","to":"t"}]}}},
	  {"id":"ok","type":"approval","data":{"prompt":"Ship {{input.items}}?","approvers":["ci"]}}],
	  "edges":[{"from":"start","to":"f"},{"from":"f","to":"each"},{"from":"each","to":"ok"}]}`
	id := b.Start(t, wf, `{"items":[1,2,3]}`)
	b.WaitFor(t, id, "the approval wait", func(ev event.Event) bool { return ev.Kind == event.StepWaiting && ev.StepID == "ok" })

	var w runs.Waterfall
	r := b.get(t, "/v1/runs/"+id+"/waterfall")
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.NoError(t, json.Unmarshal(r.body, &w))
	rows := map[string]runs.WaterfallRow{}
	var order []string
	for _, row := range w.Rows {
		rows[row.StepID] = row
		order = append(order, row.StepID)
	}
	require.Equal(t, []string{"f", "each", "each[0].t", "each[1].t", "each[2].t", "ok"}, order, "tree order")
	require.Equal(t, 3, rows["each"].Children)
	require.Equal(t, "each", rows["each[1].t"].Parent)
	require.Equal(t, 1, rows["each[1].t"].Depth)

	f := rows["f"]
	require.Len(t, f.Segments, 3)
	require.Equal(t, []string{"retried", "retried", "completed"}, []string{f.Segments[0].Outcome, f.Segments[1].Outcome, f.Segments[2].Outcome})
	// The backoff (30 ms, randomized by ±20%: the delay each
	// step_retrying journaled) shows as a gap.
	var delays []float64
	for _, ev := range b.Events(t, id) {
		if ev.Kind == event.StepRetrying && ev.StepID == "f" {
			var d event.StepRetryingData
			require.NoError(t, json.Unmarshal(ev.Data, &d))
			delays = append(delays, float64(d.DelayMs))
		}
	}
	require.Len(t, delays, 2)
	for i := 1; i < 3; i++ {
		gap := f.Segments[i].StartMs - f.Segments[i-1].EndMs
		require.GreaterOrEqual(t, delays[i-1], 23.0)
		require.GreaterOrEqual(t, gap, delays[i-1], "the backoff shows as a gap")
	}

	ok := rows["ok"]
	require.Equal(t, "waiting", string(ok.Status))
	require.Equal(t, "approval", ok.WaitReason)
	require.NotNil(t, ok.Approval)
	require.Equal(t, "Ship [1,2,3]?", ok.Approval.Prompt)
	require.Equal(t, []string{"ci"}, ok.Approval.Approvers)
	require.Len(t, ok.Segments, 1)
	require.NotNil(t, ok.Segments[0].Wait)
	require.True(t, ok.Segments[0].Wait.Open)
	require.Equal(t, "approval", ok.Segments[0].Wait.Reason)
	require.Len(t, w.Drives, 1)
	require.Equal(t, "w1", w.Drives[0].Worker)

	// Approve: the wait closes with its real length, and a second drive
	// shows.
	require.Equal(t, http.StatusOK, b.post(t, "/v1/runs/"+id+"/approve", `{"step_id":"ok","decision":"approve"}`).status)
	b.WaitEnd(t, id)
	r = b.get(t, "/v1/runs/"+id+"/waterfall")
	w = runs.Waterfall{}
	require.NoError(t, json.Unmarshal(r.body, &w))
	require.Equal(t, "succeeded", string(w.Status))
	require.Len(t, w.Drives, 2)
	require.False(t, w.Drives[1].Interrupted, "the run parked; the next drive is not a takeover")
	var approvalMark bool
	for _, m := range w.Marks {
		approvalMark = approvalMark || m.Kind == event.ApprovalReceived
	}
	require.True(t, approvalMark)
	var waitAt, endAt time.Time
	for _, ev := range b.Events(t, id) {
		if ev.StepID == "ok" && ev.Kind == event.StepWaiting {
			waitAt = ev.TS
		}
		if ev.StepID == "ok" && ev.Kind == event.StepCompleted {
			endAt = ev.TS
		}
	}
	last := w.Rows[len(w.Rows)-1]
	require.Equal(t, "ok", last.StepID)

	wait := last.Segments[0].Wait
	require.False(t, wait.Open)
	require.InDelta(t, float64(endAt.Sub(waitAt).Microseconds())/1000, wait.EndMs-wait.StartMs, 0.01, "the wait's real length")
	require.Greater(t, wait.EndMs-wait.StartMs, 0.0)
	require.InDelta(t, w.SpanMs, last.Segments[0].EndMs, 50)
}

// flakyTool fails with a retryable error the first *fails times it is
// called, then returns {"ok":true}.
func flakyTool(fails int32) workers.Tool {
	var calls atomic.Int32
	return func(context.Context, json.RawMessage) (json.RawMessage, error) {
		if calls.Add(1) <= fails {
			return nil, &workers.ToolError{Err: errors.New("flaky: not yet"), Retryable: true}
		}
		return json.RawMessage(`{"ok":true}`), nil
	}
}
