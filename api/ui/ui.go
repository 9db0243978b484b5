// Package ui holds PAL's web UI: the page templates and the CSS and
// scripts they load, embedded in the binary, so the UI needs no build
// step, no CDN and no network at run time. The api package serves it
// (browser.go there) on the REST API's address.
//
// The pages draw what the server computed: the runs list from GET
// /v1/runs (the Postgres projection), the deployed workflows and their
// versions from GET /v1/workflows and GET /v1/workflows/{name}, and a
// run's waterfall from GET
// /v1/runs/{id}/waterfall (the fold of its journal), refreshed while the
// run is in flight on each event of GET /v1/runs/{id}/events. The run
// page's Journal tab lists that feed's events as they come, from the
// first, each envelope as sent (journal.js); its Graph tab lays out and
// draws the run's workflow, each node by its outcome, from the
// waterfall's graph (graph.js); the waterfall's compressed axis is
// axis.js's, and a step's conversation in its detail conversation.js's.
// The pages operate runs
// through the REST routes with the session's CSRF token: start.js starts
// a deployed workflow, actions.js retries, forks, resumes, signals,
// raises a budget and verifies a receipt; a page shows an action only to
// a session with its scope. The scripts
// never fold events themselves, and they write every value from a run
// into the page as text (textContent), never as markup: step inputs and
// outputs are whatever a model or a tool returned. The server's
// Content-Security-Policy allows scripts from this origin only, so even
// markup that slipped in could not run.
package ui

import (
	"embed"
	"html/template"
	"io/fs"
	"sync"
)

//go:embed templates/*.html
var templates embed.FS

//go:embed static
var static embed.FS

// Pages returns the page templates (index.html, run.html,
// workflows.html, login.html, error.html), parsed once.
var Pages = sync.OnceValues(func() (*template.Template, error) {
	return template.ParseFS(templates, "templates/*.html")
})

// Static returns the CSS and scripts, served under /ui/.
func Static() fs.FS {
	sub, err := fs.Sub(static, "static")
	if err != nil { // cannot happen: "static" is embedded
		return static
	}
	return sub
}
