package api

import (
	"fmt"
	"net/http"
	"reflect"
	"slices"
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
	// Statuses are the HTTP statuses the route answers, success first:
	// api/openapi.json documents exactly these (TestOpenAPIMatchesRoutes),
	// and TestRoutesServeTheirScope fails on one the route answers
	// outside them. Any request may also be answered 405 (a wrong method)
	// or 431 (oversized headers) before it reaches a route; no route
	// lists those.
	Statuses []int
}

// Pattern is the route as http.ServeMux takes it: "GET /v1/runs".
func (r Route) Pattern() string { return r.Method + " " + r.Path }

// route is a Route and how it is served.
type route struct {
	Route
	handling
	// openable: HandlerConfig.MetricsOpen serves it without a token.
	openable bool
}

// handling is how a route is served: its handler and, for a route whose
// body is a JSON object decoded into a Go type (commandRoute), that type,
// whose JSON fields api/openapi.json's request schema must name.
type handling struct {
	serve func(h *handler, w http.ResponseWriter, r *http.Request)
	// body is the type the request body decodes into; nil for none, or a
	// body that is not an object of fields (a signal's payload, a
	// workflow definition).
	body reflect.Type
}

// plain is the handling of a route that decodes no JSON object.
func plain(serve func(h *handler, w http.ResponseWriter, r *http.Request)) handling {
	return handling{serve: serve}
}

// routes is the REST API: NewHandler serves exactly these (and the web UI's
// pages, browser.go), pal server --help prints them (Routes), and tests
// hold api/doc.go's list and api/openapi.json to them. A route is added
// here, or nowhere.
var routes = []route{
	{Route: Route{"POST", "/v1/runs", ScopeStart, "start a run: 201 created, 200 for a duplicate idempotency key", commandStatuses(201, 200, 404)}, handling: startRoute},
	{Route: Route{"GET", "/v1/runs", ScopeRead, "list runs, newest first, by label, status, workflow, time, error (the Postgres projection)", readStatuses(400, 503)}, handling: plain((*handler).listRuns)},
	{Route: Route{"GET", "/v1/runs/{id}", ScopeRead, "a run, folded from its journal (runs.RunView)", readStatuses(400, 404, 500, 503)}, handling: plain((*handler).getRun)},
	{Route: Route{"GET", "/v1/runs/{id}/events", ScopeRead, "the journal as server-sent events", readStatuses(204, 400, 404, 410, 429, 500, 503)}, handling: plain((*handler).streamEvents)},
	{Route: Route{"GET", "/v1/runs/{id}/waterfall", ScopeRead, "a run's timeline, for the web UI", readStatuses(400, 404, 500, 503)}, handling: plain((*handler).getWaterfall)},
	{Route: Route{"GET", "/v1/runs/{id}/receipt", ScopeRead, "the run's signed receipt (PAL_RECEIPTS)", readStatuses(400, 404, 500, 503)}, handling: plain((*handler).getReceipt)},
	{Route: Route{"GET", "/v1/threads/{id}", ScopeRead, "a thread's conversation: its turns with run, step, role, content, seq", readStatuses(400, 404, 500, 503)}, handling: plain((*handler).getThread)},
	{Route: Route{"GET", "/v1/keys", ScopeRead, "the receipt signing public keys", readStatuses()}, handling: plain((*handler).listKeys)},
	{Route: Route{"PUT", "/v1/workflows/{name}", ScopeDeploy, "deploy a workflow: 201 a new version, 200 unchanged", []int{201, 200, 400, 401, 403, 413, 503}}, handling: plain((*handler).deployWorkflow)},
	{Route: Route{"GET", "/v1/workflows", ScopeRead, "the deployed workflows, each at its latest version", readStatuses(503)}, handling: plain((*handler).listWorkflows)},
	{Route: Route{"GET", "/v1/workflows/{name}", ScopeRead, "a deployed workflow (?version=N) and its versions", readStatuses(400, 404, 503)}, handling: plain((*handler).getWorkflow)},
	{Route: Route{"POST", "/v1/schedules", ScopeDeploy, "create a schedule: a deployed workflow started on a cron or an interval", []int{201, 400, 401, 403, 404, 409, 413, 503}}, handling: createScheduleRoute},
	{Route: Route{"GET", "/v1/schedules", ScopeRead, "the schedules, by name", readStatuses(503)}, handling: plain((*handler).listSchedules)},
	{Route: Route{"GET", "/v1/schedules/{name}", ScopeRead, "a schedule, with its next tick", readStatuses(404, 503)}, handling: plain((*handler).getSchedule)},
	{Route: Route{"DELETE", "/v1/schedules/{name}", ScopeDeploy, "delete a schedule (its runs stay)", []int{200, 401, 403, 404, 503}}, handling: deleteScheduleRoute},
	{Route: Route{"POST", "/v1/schedules/{name}/pause", ScopeDeploy, "pause a schedule: no tick fires, none is caught up", []int{200, 401, 403, 404, 503}}, handling: pauseScheduleRoute},
	{Route: Route{"POST", "/v1/schedules/{name}/resume", ScopeDeploy, "resume a schedule from its next tick", []int{200, 401, 403, 404, 503}}, handling: resumeScheduleRoute},
	{Route: Route{"POST", "/v1/schedules/{name}/trigger", ScopeStart, "start the schedule's workflow now", []int{201, 401, 403, 404, 409, 429, 500, 503}}, handling: triggerScheduleRoute},
	{Route: Route{"POST", "/v1/runs/{id}/approve", ScopeApprove, "decide an approval step", commandStatuses(200, 404)}, handling: approveRoute},
	{Route: Route{"POST", "/v1/runs/{id}/budget", ScopeApprove, "raise a run's budget", commandStatuses(200, 404)}, handling: budgetRoute},
	{Route: Route{"POST", "/v1/runs/{id}/signals/{name}", ScopeApprove, "send a signal; the body is its payload", commandStatuses(200, 404)}, handling: signalRoute},
	{Route: Route{"POST", "/v1/runs/{id}/cancel", ScopeCancel, "cancel a run", commandStatuses(200, 404)}, handling: cancelRoute},
	{Route: Route{"POST", "/v1/runs/{id}/resume", ScopeStart, "drive a run now (force: scope admin)", commandStatuses(200, 404)}, handling: resumeRoute},
	{Route: Route{"POST", "/v1/runs/{id}/fork", ScopeStart, "a new run from a step of this one", commandStatuses(201, 404)}, handling: forkRoute},
	{Route: Route{"POST", "/v1/runs/{id}/retry", ScopeStart, "a new run from its first failed step", commandStatuses(201, 404)}, handling: retryRoute},
	{Route: Route{"POST", "/mcp", ScopeRead, "PAL as an MCP server (streamable HTTP, stateless): tools that start and steer runs, each also needing its own scope", []int{200, 202, 400, 401, 403, 406, 413, 415}}, handling: plain(mcpRoute)},
	{Route: Route{"GET", "/v1/openapi.json", ScopeRead, "this API as an OpenAPI 3.1 document (api/openapi.json)", readStatuses()}, handling: plain(serveOpenAPI)},
	{Route: Route{"GET", "/metrics", ScopeRead, "Prometheus metrics (no token with PAL_METRICS_OPEN)", readStatuses()}, openable: true,
		handling: plain(func(_ *handler, w http.ResponseWriter, r *http.Request) { telemetry.Handler().ServeHTTP(w, r) })},
	{Route: Route{"GET", "/healthz", 0, "the process is up", []int{200}}, handling: plain((*handler).healthz)},
	{Route: Route{"GET", "/readyz", 0, "NATS (and Postgres, when configured) reachable", []int{200, 503}}, handling: plain((*handler).readyz)},
}

// readStatuses are the statuses of a route that reads: 200, the token's
// 401 and 403, and more.
func readStatuses(more ...int) []int { return append([]int{200, 401, 403}, more...) }

// commandStatuses are the statuses of a command route (commandRoute):
// its success and those of its own, then those readCommand and fail may
// answer any command.
func commandStatuses(own ...int) []int {
	return append(own, 400, 401, 403, 409, 413, 429, 500, 503)
}

// Routes returns the REST API's routes: every /v1 route, /metrics and the
// probes, in the order the docs list them. On the same address are the
// gRPC service pal.v1.RunService and the web UI's pages.
func Routes() []Route {
	out := make([]Route, len(routes))
	for i, rt := range routes {
		out[i] = rt.Route
		out[i].Statuses = slices.Clone(rt.Statuses)
	}
	return out
}

// FormatRoutes writes rs one a line, as pal server --help and api/doc.go
// list them: the method, the path, the scope ("none": no token) and what
// the route does, in columns, each line starting with indent.
func FormatRoutes(rs []Route, indent string) string {
	width, mwidth := 0, 0
	for _, r := range rs {
		width, mwidth = max(width, len(r.Path)), max(mwidth, len(r.Method))
	}
	var b strings.Builder
	for _, r := range rs {
		scope := r.Scope.String()
		if r.Scope == 0 {
			scope = "none"
		}
		fmt.Fprintf(&b, "%s%-*s %-*s  %-7s  %s\n", indent, mwidth, r.Method, width, r.Path, scope, r.Does)
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
