package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strconv"
	"strings"

	"github.com/palrun/pal/runs"
)

// The routes that carry a command: POST /v1/runs, and POST
// /v1/runs/{id}/approve, cancel, budget, signals/{name}, resume, fork and
// retry. One generic route (commandRoute) reads each: its body is decoded
// straight into the runs command struct, the run id is the path's, and
// the route's act only adds what the transport knows (who the token is, a
// query parameter) before it calls runs.Client.

// command is a runs command a route's body decodes into.
type command interface {
	runs.StartCommand | runs.ApproveCommand | runs.CancelCommand | runs.BudgetCommand | runs.SignalCommand |
		runs.ResumeCommand | runs.ForkCommand | runs.RetryCommand
}

// bodyRule is what a command route's request body holds.
type bodyRule int

const (
	// bodyRequired: the command, as JSON.
	bodyRequired bodyRule = iota
	// bodyOptional: the command as JSON, or nothing for its zero value.
	bodyOptional
	// bodyPayload: the command's payload, any JSON (nothing is null): a
	// signal's.
	bodyPayload
)

// commandFields point at the fields of a command the transport fills.
type commandFields struct {
	// runID is the run the path names (nil: the path names none, as
	// POST /v1/runs).
	runID *string
	// replyTo is the command's reply subject: not REST's, whose answer is
	// the HTTP response.
	replyTo *string
	// payload takes a bodyPayload body.
	payload *json.RawMessage
}

// fieldsOf returns c's commandFields; ok is false for a type command does
// not list (not reached: the constraint keeps them out).
func fieldsOf(c any) (f commandFields, ok bool) {
	switch c := c.(type) {
	case *runs.StartCommand:
		return commandFields{replyTo: &c.ReplyTo}, true
	case *runs.ApproveCommand:
		return commandFields{runID: &c.RunID, replyTo: &c.ReplyTo}, true
	case *runs.CancelCommand:
		return commandFields{runID: &c.RunID, replyTo: &c.ReplyTo}, true
	case *runs.BudgetCommand:
		return commandFields{runID: &c.RunID, replyTo: &c.ReplyTo}, true
	case *runs.SignalCommand:
		return commandFields{runID: &c.RunID, replyTo: &c.ReplyTo, payload: &c.Payload}, true
	case *runs.ResumeCommand:
		return commandFields{runID: &c.RunID, replyTo: &c.ReplyTo}, true
	case *runs.ForkCommand:
		return commandFields{runID: &c.RunID, replyTo: &c.ReplyTo}, true
	case *runs.RetryCommand:
		return commandFields{runID: &c.RunID, replyTo: &c.ReplyTo}, true
	}
	return commandFields{}, false
}

// answer is what a command route answers: status and body, and for a
// run it made, the run's id for the Location header.
type answer struct {
	status int
	body   any
	made   string
}

// ok is the answer {"ok":true,"run_id"} to a command on run id that
// returned err.
func ok(id string, err error) (answer, error) {
	if err != nil {
		return answer{}, err
	}
	return answer{status: http.StatusOK, body: OKAnswer{OK: true, RunID: id}}, nil
}

// commandRoute is a route whose body is the command C: read (at most
// MaxBodyBytes, 413 beyond) and decoded straight into C by rule (strictly:
// unknown fields, wrong types and trailing data are refused naming the
// field); the path's run id checked, a body's run_id other than it
// refused, and a reply_to refused; then act carries it out and returns the
// answer. Every error is answered as fail classifies it; nothing is
// written before act.
func commandRoute[C command](rule bodyRule, act func(ctx context.Context, h *handler, r *http.Request, c *C) (answer, error)) handling {
	var body reflect.Type
	if rule != bodyPayload {
		body = reflect.TypeFor[C]()
	}
	return handling{body: body, serve: func(h *handler, w http.ResponseWriter, r *http.Request) {
		c, err := readCommand[C](w, r, rule)
		if err != nil {
			h.fail(w, r, err)
			return
		}
		ctx, cancel := requestContext(r)
		defer cancel()
		a, err := act(ctx, h, r, c)
		if err != nil {
			h.fail(w, r, err)
			return
		}
		if a.made != "" {
			w.Header().Set("Location", "/v1/runs/"+a.made)
		}
		writeJSON(w, a.status, a.body)
	}}
}

// readCommand reads a command route's request into a C.
func readCommand[C command](w http.ResponseWriter, r *http.Request, rule bodyRule) (*C, error) {
	c := new(C)
	f, known := fieldsOf(c)
	if !known {
		return nil, fmt.Errorf("api: no fields known for the command %T", c)
	}
	var id string
	if f.runID != nil {
		var err error
		if id, err = pathRunID(r); err != nil {
			return nil, err
		}
	}
	body, empty, err := readBody(w, r)
	if err != nil {
		return nil, err
	}
	switch {
	case rule == bodyPayload && empty:
	case rule == bodyPayload:
		if !json.Valid(body) {
			return nil, &runs.InputError{Field: "payload", Msg: "the body is the signal's payload and must be JSON"}
		}
		*f.payload = body
	case !empty || rule == bodyRequired:
		if err := runs.DecodeStrict(body, c); err != nil {
			return nil, err
		}
	}
	if *f.replyTo != "" {
		return nil, &runs.InputError{Field: "reply_to", Msg: "not taken over REST: the answer is the HTTP response"}
	}
	if f.runID != nil {
		if *f.runID != "" && *f.runID != id {
			return nil, &runs.InputError{Field: "run_id", Msg: fmt.Sprintf("%q does not match the run id in the path (%s); leave it out", *f.runID, id)}
		}
		*f.runID = id
	}
	return c, nil
}

// StartAnswer is the answer to POST /v1/runs.
type StartAnswer struct {
	RunID string `json:"run_id"`
	// Created is false when an earlier request with the same idempotency
	// key created the run.
	Created bool `json:"created"`
}

// OKAnswer is the answer to approve, cancel, budget and a signal.
type OKAnswer struct {
	OK    bool   `json:"ok"`
	RunID string `json:"run_id"`
}

// ResumeAnswer is the answer to a resume.
type ResumeAnswer struct {
	OK      bool   `json:"ok"`
	RunID   string `json:"run_id"`
	Broke   string `json:"broke,omitempty"`
	TakenBy string `json:"taken_by,omitempty"`
}

// POST /v1/runs: the header Idempotency-Key may stand in for the body's
// idempotency_key; the token's name starts the run, and its scopes say
// whether it may bring a definition (deploy) or only name a deployed one.
var startRoute = commandRoute(bodyRequired, func(ctx context.Context, h *handler, r *http.Request, c *runs.StartCommand) (answer, error) {
	if c.IdempotencyKey == "" {
		c.IdempotencyKey = strings.TrimSpace(r.Header.Get("Idempotency-Key"))
	}
	c.By, c.Rights = identity(ctx), rightsOf(ctx)
	res, err := h.client.Start(ctx, *c)
	if err != nil && res.RunID == "" {
		return answer{}, asToken(ctx, err)
	}
	if err != nil {
		// Created but not queued: the recovery sweep queues it.
		h.log.Warn("run created but not queued", "run_id", res.RunID, "err", err)
	}
	a := answer{status: http.StatusOK, body: StartAnswer{RunID: res.RunID, Created: res.Created}}
	if res.Created {
		a.status, a.made = http.StatusCreated, res.RunID
	}
	return a, nil
})

// POST /v1/runs/{id}/approve: the approver is the token's name (another
// needs scope admin).
var approveRoute = commandRoute(bodyRequired, func(ctx context.Context, h *handler, r *http.Request, c *runs.ApproveCommand) (answer, error) {
	var err error
	if c.Approver, err = actingAs(ctx, "approver", c.Approver); err != nil {
		return answer{}, err
	}
	return ok(c.RunID, h.client.Approve(ctx, *c))
})

// POST /v1/runs/{id}/cancel, body optional: by is the token's name
// (another needs scope admin).
var cancelRoute = commandRoute(bodyOptional, func(ctx context.Context, h *handler, r *http.Request, c *runs.CancelCommand) (answer, error) {
	var err error
	if c.By, err = actingAs(ctx, "by", c.By); err != nil {
		return answer{}, err
	}
	return ok(c.RunID, h.client.Cancel(ctx, *c))
})

// POST /v1/runs/{id}/budget: by is the token's name (another needs scope
// admin).
var budgetRoute = commandRoute(bodyRequired, func(ctx context.Context, h *handler, r *http.Request, c *runs.BudgetCommand) (answer, error) {
	var err error
	if c.By, err = actingAs(ctx, "by", c.By); err != nil {
		return answer{}, err
	}
	return ok(c.RunID, h.client.RaiseBudget(ctx, *c))
})

// POST /v1/runs/{id}/signals/{name}: the body is the payload; the sender
// is the token's name.
var signalRoute = commandRoute(bodyPayload, func(ctx context.Context, h *handler, r *http.Request, c *runs.SignalCommand) (answer, error) {
	c.Signal, c.By = r.PathValue("name"), identity(ctx)
	return ok(c.RunID, h.client.Signal(ctx, *c))
})

// POST /v1/runs/{id}/resume, body optional: ?force=true stands in for
// {"force":true}; taking a run from the worker that holds it is an
// operator's act and needs scope admin.
var resumeRoute = commandRoute(bodyOptional, func(ctx context.Context, h *handler, r *http.Request, c *runs.ResumeCommand) (answer, error) {
	if v := r.URL.Query().Get("force"); v != "" {
		f, err := strconv.ParseBool(v)
		if err != nil {
			return answer{}, &runs.InputError{Field: "force", Msg: fmt.Sprintf("%q: want true or false", clipText(v, 20))}
		}
		c.Force = c.Force || f
	}
	if who := principalOf(ctx); c.Force && !who.scopes.Has(ScopeAdmin) {
		return answer{}, &forbiddenError{field: "force", detail: fmt.Sprintf("token %s lacks scope %s, which a forced resume needs", who.name, ScopeAdmin)}
	}
	res, err := h.client.Resume(ctx, *c)
	if err != nil {
		return answer{}, err
	}
	if res.Broke != "" {
		// A resume writes no event: the log is where a broken lease shows.
		h.log.Info("forced resume broke a lease", "run_id", c.RunID, "holder", res.Broke, "by", identity(ctx), "taken_by", res.TakenBy)
	}
	return answer{status: http.StatusOK, body: ResumeAnswer{OK: true, RunID: c.RunID, Broke: res.Broke, TakenBy: res.TakenBy}}, nil
})

// POST /v1/runs/{id}/fork: the token's name forks.
var forkRoute = commandRoute(bodyRequired, func(ctx context.Context, h *handler, r *http.Request, c *runs.ForkCommand) (answer, error) {
	c.By, c.Rights = identity(ctx), rightsOf(ctx)
	res, err := h.client.Fork(ctx, *c)
	return h.forked(res, asToken(ctx, err))
})

// POST /v1/runs/{id}/retry, body optional: the token's name retries.
var retryRoute = commandRoute(bodyOptional, func(ctx context.Context, h *handler, r *http.Request, c *runs.RetryCommand) (answer, error) {
	c.By, c.Rights = identity(ctx), rightsOf(ctx)
	res, err := h.client.Retry(ctx, *c)
	return h.forked(res, asToken(ctx, err))
})

// forked answers a fork or retry: 201 with the new run's Location and
// what it copies and runs again.
func (h *handler) forked(res runs.ForkResult, err error) (answer, error) {
	if err != nil && res.RunID == "" {
		return answer{}, err
	}
	if err != nil {
		h.log.Warn("forked run created but not queued", "run_id", res.RunID, "err", err)
	}
	return answer{status: http.StatusCreated, body: res, made: res.RunID}, nil
}

// forbiddenError refuses what the request's token may not do (403
// forbidden, naming the field at fault); nothing is written.
type forbiddenError struct {
	field, detail string
}

func (e *forbiddenError) Error() string { return e.detail }

// actingAs returns the name a request acts as when its body names one
// (approver, by): the token's own name when the body leaves it out or
// repeats it. Naming anyone else needs scope admin; without it the
// request is refused with a *forbiddenError naming field.
func actingAs(ctx context.Context, field, named string) (string, error) {
	who := principalOf(ctx)
	if named == "" || named == who.name {
		return who.name, nil
	}
	if who.scopes.Has(ScopeAdmin) {
		return named, nil
	}
	// The named value is not quoted: it is the client's, of any size.
	return "", &forbiddenError{field: field, detail: fmt.Sprintf(
		"token %s lacks scope %s, which naming another %s needs (leave %s out, or set it to %s)",
		who.name, ScopeAdmin, field, field, who.name)}
}

func clipText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
