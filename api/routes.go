package api

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/palrun/pal/internal/telemetry"
)

// Route is one route of the REST API.
type Route struct {
	// Method and Path are the route's pattern, as http.ServeMux takes it.
	Method, Path string
	// Scope is the scope a token needs; 0 for none (the probes).
	Scope Scopes
	// Does says what the route does, in a few words.
	Does string
}

// Pattern is the route as http.ServeMux takes it: "GET /v1/runs".
func (r Route) Pattern() string { return r.Method + " " + r.Path }

// route is a Route and how it is served.
type route struct {
	Route
	serve func(h *handler, w http.ResponseWriter, r *http.Request)
	// openable: HandlerConfig.MetricsOpen serves it without a token.
	openable bool
}

// routes is the REST API: NewHandler serves exactly these (and the web UI's
// pages, browser.go), pal server --help prints them (Routes), and a test
// holds api/doc.go's list to them. A route is added here, or nowhere.
var routes = []route{
	{Route: Route{"POST", "/v1/runs", ScopeStart, "start a run: 201 created, 200 for a duplicate idempotency key"}, serve: startRoute},
	{Route: Route{"GET", "/v1/runs", ScopeRead, "list runs, newest first, by label, status, workflow, time, error (the Postgres projection)"}, serve: (*handler).listRuns},
	{Route: Route{"GET", "/v1/runs/{id}", ScopeRead, "a run, folded from its journal (runs.RunView)"}, serve: (*handler).getRun},
	{Route: Route{"GET", "/v1/runs/{id}/events", ScopeRead, "the journal as server-sent events"}, serve: (*handler).streamEvents},
	{Route: Route{"GET", "/v1/runs/{id}/waterfall", ScopeRead, "a run's timeline, for the web UI"}, serve: (*handler).getWaterfall},
	{Route: Route{"GET", "/v1/runs/{id}/receipt", ScopeRead, "the run's signed receipt (PAL_RECEIPTS)"}, serve: (*handler).getReceipt},
	{Route: Route{"GET", "/v1/keys", ScopeRead, "the receipt signing public keys"}, serve: (*handler).listKeys},
	{Route: Route{"PUT", "/v1/workflows/{name}", ScopeDeploy, "deploy a workflow: 201 a new version, 200 unchanged"}, serve: (*handler).deployWorkflow},
	{Route: Route{"GET", "/v1/workflows", ScopeRead, "the deployed workflows, each at its latest version"}, serve: (*handler).listWorkflows},
	{Route: Route{"GET", "/v1/workflows/{name}", ScopeRead, "a deployed workflow (?version=N) and its versions"}, serve: (*handler).getWorkflow},
	{Route: Route{"POST", "/v1/runs/{id}/approve", ScopeApprove, "decide an approval step"}, serve: approveRoute},
	{Route: Route{"POST", "/v1/runs/{id}/budget", ScopeApprove, "raise a run's budget"}, serve: budgetRoute},
	{Route: Route{"POST", "/v1/runs/{id}/signals/{name}", ScopeApprove, "send a signal; the body is its payload"}, serve: signalRoute},
	{Route: Route{"POST", "/v1/runs/{id}/cancel", ScopeCancel, "cancel a run"}, serve: cancelRoute},
	{Route: Route{"POST", "/v1/runs/{id}/resume", ScopeStart, "drive a run now (force: scope admin)"}, serve: resumeRoute},
	{Route: Route{"POST", "/v1/runs/{id}/fork", ScopeStart, "a new run from a step of this one"}, serve: forkRoute},
	{Route: Route{"POST", "/v1/runs/{id}/retry", ScopeStart, "a new run from its first failed step"}, serve: retryRoute},
	{Route: Route{"GET", "/metrics", ScopeRead, "Prometheus metrics (no token with PAL_METRICS_OPEN)"}, openable: true,
		serve: func(_ *handler, w http.ResponseWriter, r *http.Request) { telemetry.Handler().ServeHTTP(w, r) }},
	{Route: Route{"GET", "/healthz", 0, "the process is up"}, serve: (*handler).healthz},
	{Route: Route{"GET", "/readyz", 0, "NATS (and Postgres, when configured) reachable"}, serve: (*handler).readyz},
}

// Routes returns the REST API's routes: every /v1 route, /metrics and the
// probes, in the order the docs list them. On the same address are the
// gRPC service pal.v1.RunService and the web UI's pages.
func Routes() []Route {
	out := make([]Route, len(routes))
	for i, rt := range routes {
		out[i] = rt.Route
	}
	return out
}

// FormatRoutes writes rs one a line, as pal server --help and api/doc.go
// list them: the method, the path, the scope ("none": no token) and what
// the route does, in columns, each line starting with indent.
func FormatRoutes(rs []Route, indent string) string {
	width := 0
	for _, r := range rs {
		width = max(width, len(r.Path))
	}
	var b strings.Builder
	for _, r := range rs {
		scope := r.Scope.String()
		if r.Scope == 0 {
			scope = "none"
		}
		fmt.Fprintf(&b, "%s%-4s %-*s  %-7s  %s\n", indent, r.Method, width, r.Path, scope, r.Does)
	}
	return b.String()
}

// mux serves the routes: the /v1 routes (and /metrics, unless
// MetricsOpen) behind the token check and their scope's, the probes
// without a token (and JSON errors for a wrong method), the web UI's
// pages (browser.go); anything else is a JSON 404 or 405 for a request
// with a token.
func (h *handler) mux() *http.ServeMux {
	v1, open, root := http.NewServeMux(), http.NewServeMux(), http.NewServeMux()
	probes := jsonFallbacks(open)
	for _, rt := range routes {
		serve := func(w http.ResponseWriter, r *http.Request) { rt.serve(h, w, r) }
		switch {
		case rt.openable && h.cfg.MetricsOpen:
			root.HandleFunc(rt.Pattern(), serve)
		case rt.Scope == 0:
			open.HandleFunc(rt.Pattern(), serve)
			root.Handle(rt.Path, probes)
		default:
			v1.HandleFunc(rt.Pattern(), need(rt.Scope, serve))
		}
	}
	root.Handle("/", h.requireToken(jsonFallbacks(v1)))
	h.browserRoutes(root)
	return root
}
