package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/api"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/runs"
)

func TestParseTokenScopes(t *testing.T) {
	t.Parallel()
	d := api.DefaultScopes
	for in, want := range map[string][]api.Token{
		"ci=tok":                       {{Name: "ci", Secret: "tok", Scopes: d}},
		"tok":                          {{Name: "api", Secret: "tok", Scopes: d}},
		"ci=tok:read":                  {{Name: "ci", Secret: "tok", Scopes: api.ScopeRead}},
		"ci=tok:read+start":            {{Name: "ci", Secret: "tok", Scopes: api.ScopeRead | api.ScopeStart}},
		"ci=tok:admin":                 {{Name: "ci", Secret: "tok", Scopes: api.ScopeAdmin}},
		"tok:approve+cancel":           {{Name: "api", Secret: "tok", Scopes: api.ScopeApprove | api.ScopeCancel}},
		"ci=a:b:read":                  {{Name: "ci", Secret: "a:b", Scopes: api.ScopeRead}},
		"ci=t=x:admin+read":            {{Name: "ci", Secret: "t=x", Scopes: api.ScopeAdmin | api.ScopeRead}},
		" ci = tok : read + start ":    {{Name: "ci", Secret: "tok", Scopes: api.ScopeRead | api.ScopeStart}},
		"a=x:read,b=y:start+approve,z": {{Name: "a", Secret: "x", Scopes: api.ScopeRead}, {Name: "b", Secret: "y", Scopes: api.ScopeStart | api.ScopeApprove}, {Name: "api", Secret: "z", Scopes: d}},
	} {
		got, err := api.ParseTokens(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
		// What Entry writes reads back the same, a ':' in a token included.
		again, err := api.ParseTokens(api.FormatTokens(got))
		require.NoError(t, err, in)
		require.Equal(t, got, again, in)
	}
	require.Equal(t, "dev=a:b:read+start+approve+cancel", api.Token{Name: "dev", Secret: "a:b"}.Entry())
	require.True(t, api.ScopeAdmin.Has(api.ScopeCancel), "admin implies every scope")
	require.False(t, api.DefaultScopes.Has(api.ScopeAdmin))

	for _, tc := range []struct{ in, want string }{
		{"ci=s3cr3t:", "token 1 (ci): no scopes after ':'"},
		{"ci=s3cr3t: ", "no scopes after ':'"},
		{"ci=s3cr3t:+", "scope 1 of 2 after the last ':' is not one of read, start, approve, cancel, deploy or admin"},
		{"ci=s3cr3t:read+", "scope 2 of 2"},
		{"ci=s3cr3t:raed", "scope 1 of 1"},
		{"ci=s3cr3t:READ", "scope 1 of 1"},
		{"ok=x,ci=s3cr3t:read+read", "token 2 (ci): scope read is listed twice"},
		{"s3cr3t:tail", "token 1 (api): scope 1 of 1 after the last ':' is not one of"},
		{"ci=s3cr3t:tail", "a token that contains ':' must be followed by ':' and its scopes"},
		{"ci=:read", "token 1 (ci): empty token"},
		{"a=s3cr3t:read,b=s3cr3t:admin", "token 2 (b): the same token is listed twice"},
	} {
		_, err := api.ParseTokens(tc.in)
		require.ErrorContains(t, err, tc.want, tc.in)
		for _, secret := range []string{"s3cr3t", "tail", "raed", "READ"} {
			require.NotContains(t, err.Error(), secret, "%s: an error must not quote the token", tc.in)
		}
	}
}

// TestScopes sends each route a token with every other scope and checks
// the 403, then one with the route's scope and checks it gets past.
func TestScopes(t *testing.T) {
	t.Parallel()
	scoped := map[string]api.Scopes{"r": api.ScopeRead, "s": api.ScopeStart, "ap": api.ScopeApprove, "c": api.ScopeCancel}
	var tokens []api.Token
	for name, s := range scoped {
		tokens = append(tokens, api.Token{Name: name, Secret: "tok-" + name, Scopes: s})
	}
	tokens = append(tokens, api.Token{Name: "lead", Secret: adminToken, Scopes: api.ScopeAdmin})
	b := setup(t, withTokens(tokens, false)) // no worker: nothing moves
	_, err := runs.New(b.Store).Start(context.Background(), runs.StartCommand{RunID: "run_a", Workflow: json.RawMessage(echoWorkflow)})
	require.NoError(t, err)

	// Past the scope check each request is refused for another reason (or
	// only reads), so nothing is written either way.
	routes := []struct {
		method, path, body string
		scope              string
		past               int
	}{
		{"POST", "/v1/runs", `{}`, "start", 400},
		{"GET", "/v1/runs", "", "read", 503},
		{"GET", "/v1/runs/run_a", "", "read", 200},
		{"GET", "/v1/runs/run_nope/events", "", "read", 404},
		{"POST", "/v1/runs/run_a/approve", `{"step_id":"nope","decision":"approve"}`, "approve", 409},
		{"POST", "/v1/runs/run_nope/cancel", "", "cancel", 404},
	}
	before := b.journalState(t)
	for _, rt := range routes {
		for name := range scoped {
			res := b.do(t, rt.method, rt.path, strings.NewReader(rt.body), bearerOf("tok-"+name)...)
			if map[string]string{"r": "read", "s": "start", "ap": "approve", "c": "cancel"}[name] == rt.scope {
				require.Equal(t, rt.past, res.status, "%s %s as %s: %s", rt.method, rt.path, name, res.body)
				continue
			}
			m := requireError(t, res, http.StatusForbidden, "forbidden")
			require.Equal(t, fmt.Sprintf("token %s lacks scope %s", name, rt.scope), m["detail"], "%s %s", rt.method, rt.path)
		}
		res := b.do(t, rt.method, rt.path, strings.NewReader(rt.body), bearerOf(adminToken)...)
		require.Equal(t, rt.past, res.status, "%s %s as admin: %s", rt.method, rt.path, res.body)
	}
	require.Equal(t, before, b.journalState(t), "a refused request changed the journal")
	// Routing answers before scopes: an unknown route or method is 404 or
	// 405 for any token.
	requireError(t, b.do(t, "DELETE", "/v1/runs/run_a", nil, bearerOf("tok-s")...), 405, "method_not_allowed")
	requireError(t, b.get(t, "/v1/jobs", bearerOf("tok-c")...), 404, "not_found")
}

// TestIdentityFromToken: on REST the approver and the canceller are the
// token's name; naming someone else needs scope admin, and a step's
// approvers hold either way.
func TestIdentityFromToken(t *testing.T) {
	t.Parallel()
	const advToken, anaToken = "adv-token-0123456789", "ana-token-0123456789"
	b := setup(t, withWorker(), withTokens([]api.Token{{Name: "ci", Secret: testToken}, {Name: "adv", Secret: advToken},
		{Name: "ana", Secret: anaToken}, {Name: "lead", Secret: adminToken, Scopes: api.ScopeAdmin}}, false))
	wf := `{"name":"gate","nodes":[{"id":"start","type":"trigger"},
		{"id":"ok","type":"approval","data":{"prompt":"Ship it?","approvers":["ana"]}},
		{"id":"done","type":"tool","data":{"tool":"echo"}}],
		"edges":[{"from":"start","to":"ok"},{"from":"ok","to":"done"}]}`
	start := func() string {
		res := b.post(t, "/v1/runs", `{"workflow":`+wf+`}`)
		require.Equal(t, http.StatusCreated, res.status, "%s", res.body)
		id := res.json(t)["run_id"].(string)
		b.WaitFor(t, id, "the approval wait", func(ev event.Event) bool { return ev.Kind == event.StepWaiting })
		return id
	}
	approve := func(id, tok, body string) response {
		return b.post(t, "/v1/runs/"+id+"/approve", body, bearerOf(tok)...)
	}
	decision := func(id string) (event.Event, event.ApprovalReceivedData) {
		ev := b.WaitFor(t, id, "the decision", func(ev event.Event) bool { return ev.Kind == event.ApprovalReceived })
		var d event.ApprovalReceivedData
		require.NoError(t, ev.DecodeData(&d))
		return ev, d
	}

	id := start()
	before := b.journalState(t)
	// adv speaking for ana: refused as a spoof, before the step is looked at.
	m := requireError(t, approve(id, advToken, `{"step_id":"ok","decision":"approve","approver":"ana"}`), http.StatusForbidden, "forbidden")
	require.Equal(t, "approver", m["field"])
	require.Contains(t, m["detail"], "token adv lacks scope admin")
	require.NotContains(t, m["detail"], "ana", "the body's value is not quoted")
	// adv as itself, named or not: refused by the step's approvers.
	for _, body := range []string{`{"step_id":"ok","decision":"approve"}`, `{"step_id":"ok","decision":"approve","approver":"adv"}`} {
		m = requireError(t, approve(id, advToken, body), http.StatusBadRequest, "bad_input")
		require.Equal(t, "approver", m["field"])
		require.Contains(t, m["detail"], `"adv" may not decide step ok (approvers: ana)`)
	}
	// An admin token cannot slip past approvers either.
	m = requireError(t, approve(id, adminToken, `{"step_id":"ok","decision":"approve"}`), http.StatusBadRequest, "bad_input")
	require.Equal(t, "approver", m["field"])
	require.Equal(t, before, b.journalState(t), "a refused approval changed the journal")

	// ana naming herself is fine, and is what the journal says.
	require.Equal(t, http.StatusOK, approve(id, anaToken, `{"step_id":"ok","decision":"approve","approver":"ana"}`).status)
	ev, d := decision(id)
	require.Equal(t, "ana", ev.WorkerID)
	require.Equal(t, "ana", d.Approver)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, id).Kind)

	// An admin token may decide for ana.
	id = start()
	require.Equal(t, http.StatusOK, approve(id, adminToken, `{"step_id":"ok","decision":"reject","approver":"ana"}`).status)
	ev, d = decision(id)
	require.Equal(t, "ana", ev.WorkerID)
	require.Equal(t, "reject", d.Decision)
	require.Equal(t, event.RunFailed, b.WaitEnd(t, id).Kind)

	// Cancels: "by":"root" from a non-admin is refused; the canceller
	// journaled is the token's name, or whom an admin names.
	cancelled := func(id string) event.Event {
		final := b.WaitEnd(t, id)
		require.Equal(t, event.RunCancelled, final.Kind)
		return final
	}
	id = start()
	before = b.journalState(t)
	m = requireError(t, b.post(t, "/v1/runs/"+id+"/cancel", `{"by":"root"}`), http.StatusForbidden, "forbidden")
	require.Equal(t, "by", m["field"])
	require.Contains(t, m["detail"], "token ci lacks scope admin")
	require.Equal(t, before, b.journalState(t), "a refused cancel changed the journal")
	require.Equal(t, http.StatusOK, b.post(t, "/v1/runs/"+id+"/cancel", `{"by":"ci","reason":"done"}`).status)
	final := cancelled(id)
	var cd event.RunCancelledData
	require.NoError(t, final.DecodeData(&cd))
	require.Equal(t, "ci", final.WorkerID)
	require.Equal(t, "ci", cd.By)

	id = start()
	require.Equal(t, http.StatusOK, b.post(t, "/v1/runs/"+id+"/cancel", `{"by":"root"}`, bearerOf(adminToken)...).status)
	final = cancelled(id)
	require.NoError(t, final.DecodeData(&cd))
	require.Equal(t, "root", final.WorkerID)
	require.Equal(t, "root", cd.By)

	// The starter is the token's name too.
	require.Equal(t, "ci", b.Events(t, id)[0].WorkerID)
}
