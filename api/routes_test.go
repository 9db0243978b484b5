package api_test

import (
	"encoding/json"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/api"
)

// TestRoutesAreDocumented holds the docs to the one list of routes (the
// list NewHandler registers from): api/doc.go lists exactly Routes, as
// FormatRoutes writes them, and docs/architecture.md §9.4 names each. A
// route added to the table without its docs fails here.
func TestRoutesAreDocumented(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("doc.go")
	require.NoError(t, err)
	listed := regexp.MustCompile(`(?m)^//\t(GET|POST|PUT|PATCH|DELETE) .*\n`).FindAllString(string(doc), -1)
	require.Equal(t, api.FormatRoutes(api.Routes(), "//\t"), strings.Join(listed, ""),
		"api/doc.go's route list is not Routes: paste api.FormatRoutes(api.Routes(), \"//\\t\")")

	arch, err := os.ReadFile("../docs/architecture.md")
	require.NoError(t, err)
	rest := string(arch)
	start := strings.Index(rest, "### §9.4 REST")
	require.GreaterOrEqual(t, start, 0, "docs/architecture.md has no §9.4 REST")
	rest = rest[start:]
	rest = rest[:strings.Index(rest, "### §9.4.1")]
	for _, r := range api.Routes() {
		require.Contains(t, rest, "`"+r.Pattern(), "docs/architecture.md §9.4 does not list %s", r.Pattern())
	}
}

// TestRoutesServeTheirScope sends every route of Routes, as the handler
// serves it, a token of each other scope and checks the 403 naming the
// scope the list gives; then one with that scope, and admin, and checks
// they get past it to the route (no "no such endpoint", no 405). The
// probes answer without a token. Nothing is written.
func TestRoutesServeTheirScope(t *testing.T) {
	t.Parallel()
	scoped := map[string]api.Scopes{"r": api.ScopeRead, "s": api.ScopeStart, "ap": api.ScopeApprove, "c": api.ScopeCancel}
	var tokens []api.Token
	for name, s := range scoped {
		tokens = append(tokens, api.Token{Name: name, Secret: "tok-" + name, Scopes: s})
	}
	tokens = append(tokens, api.Token{Name: "lead", Secret: adminToken, Scopes: api.ScopeAdmin})
	b := setup(t, withTokens(tokens, false)) // no worker: nothing moves
	before := b.journalState(t)
	// Past the scope check each request is refused for another reason (an
	// unknown run, a body without what it needs) or only reads.
	path := strings.NewReplacer("{id}", "run_nope", "{name}", "go")
	routed := func(r api.Route, res response) {
		t.Helper()
		require.NotEqual(t, http.StatusMethodNotAllowed, res.status, "%s: %s", r.Pattern(), res.body)
		require.NotEqual(t, http.StatusForbidden, res.status, "%s: %s", r.Pattern(), res.body)
		require.NotEqual(t, http.StatusUnauthorized, res.status, "%s: %s", r.Pattern(), res.body)
		require.NotContains(t, string(res.body), "no such endpoint", r.Pattern())
		require.Contains(t, r.Statuses, res.status, "%s answered %d, which its Statuses (and api/openapi.json) do not list: %s", r.Pattern(), res.status, res.body)
	}
	for _, r := range api.Routes() {
		p := path.Replace(r.Path)
		if r.Scope == 0 {
			routed(r, b.do(t, r.Method, p, nil, "Authorization", ""))
			continue
		}
		for name, s := range scoped {
			res := b.do(t, r.Method, p, strings.NewReader(`{}`), bearerOf("tok-"+name)...)
			if s == r.Scope {
				routed(r, res)
				continue
			}
			require.Contains(t, r.Statuses, http.StatusForbidden, r.Pattern())
			m := requireError(t, res, http.StatusForbidden, "forbidden")
			require.Equal(t, "token "+name+" lacks scope "+r.Scope.String(), m["detail"], r.Pattern())
		}
		routed(r, b.do(t, r.Method, p, strings.NewReader(`{}`), bearerOf(adminToken)...))
	}
	require.Equal(t, before, b.journalState(t), "a refused request changed the journal")
}

// TestOpenAPIServed: GET /v1/openapi.json answers a read token the
// document committed as api/openapi.json (the one api.OpenAPI embeds),
// OpenAPI 3.1 JSON; without a token it is 401 like every /v1 route.
func TestOpenAPIServed(t *testing.T) {
	t.Parallel()
	b := setup(t, withTokens([]api.Token{{Name: "r", Secret: "tok-r", Scopes: api.ScopeRead}}, false))
	res := b.get(t, "/v1/openapi.json", bearerOf("tok-r")...)
	require.Equal(t, http.StatusOK, res.status, string(res.body))
	require.Equal(t, "application/json", res.header.Get("Content-Type"))
	committed, err := os.ReadFile("openapi.json")
	require.NoError(t, err)
	require.Equal(t, committed, res.body, "GET /v1/openapi.json is not api/openapi.json")
	require.Equal(t, committed, api.OpenAPI())
	var doc struct {
		OpenAPI string         `json:"openapi"`
		Paths   map[string]any `json:"paths"`
	}
	require.NoError(t, json.Unmarshal(res.body, &doc))
	require.Equal(t, "3.1.0", doc.OpenAPI)
	require.Contains(t, doc.Paths, "/v1/openapi.json")

	requireError(t, b.get(t, "/v1/openapi.json", "Authorization", ""), http.StatusUnauthorized, "unauthorized")
}

// TestCommandRoutesRefuseReplyTo: a REST command's answer is its HTTP
// response, so a body naming a reply subject is refused on every route
// that decodes a runs command, and nothing is written.
func TestCommandRoutesRefuseReplyTo(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.Start(t, echoWorkflow, `{}`)
	before := b.journalState(t)
	for _, route := range []string{"approve", "cancel", "budget", "resume", "fork", "retry"} {
		res := b.post(t, "/v1/runs/"+id+"/"+route, `{"reply_to":"_INBOX.x"}`, bearerOf(adminToken)...)
		m := requireError(t, res, http.StatusBadRequest, "bad_input")
		require.Equal(t, "reply_to", m["field"], route)
	}
	require.Equal(t, before, b.journalState(t), "a refused request changed the journal")
}
