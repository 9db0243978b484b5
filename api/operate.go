package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/palrun/pal/runs"
)

// The operator's routes: signals, resume, fork and retry.
//
//	POST /v1/runs/{id}/signals/{name}  scope approve; body = the payload (JSON, at most runs.MaxSignalPayloadBytes)
//	POST /v1/runs/{id}/resume          scope start; ?force=true or {"force":true} needs admin
//	POST /v1/runs/{id}/fork            scope start; {"from","workflow"?,"input"?,"new_run_id"?}
//	POST /v1/runs/{id}/retry           scope start; {"new_run_id"?}, body optional
func (h *handler) operateRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/runs/{id}/signals/{name}", need(ScopeApprove, h.signal))
	mux.HandleFunc("POST /v1/runs/{id}/resume", need(ScopeStart, h.resume))
	mux.HandleFunc("POST /v1/runs/{id}/fork", need(ScopeStart, h.fork))
	mux.HandleFunc("POST /v1/runs/{id}/retry", need(ScopeStart, h.retry))
}

// ResumeAnswer is the answer to a resume.
type ResumeAnswer struct {
	OK      bool   `json:"ok"`
	RunID   string `json:"run_id"`
	Broke   string `json:"broke,omitempty"`
	TakenBy string `json:"taken_by,omitempty"`
}

func (h *handler) signal(w http.ResponseWriter, r *http.Request) {
	id, err := pathRunID(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	body, empty, err := readBody(w, r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	payload := json.RawMessage(body)
	if empty {
		payload = nil
	} else if !json.Valid(body) {
		h.fail(w, r, &runs.InputError{Field: "payload", Msg: "the body is the signal's payload and must be JSON"})
		return
	}
	ctx, cancel := requestContext(r)
	defer cancel()
	err = h.client.Signal(ctx, runs.SignalCommand{RunID: id, Signal: r.PathValue("name"), Payload: payload, By: identity(r.Context())})
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, OKAnswer{OK: true, RunID: id})
}

// resumeBody is POST /v1/runs/{id}/resume (optional).
type resumeBody struct {
	RunID string `json:"run_id,omitempty"`
	Force bool   `json:"force,omitempty"`
}

func (b *resumeBody) bodyRun() string { return b.RunID }

func (h *handler) resume(w http.ResponseWriter, r *http.Request) {
	var b resumeBody
	id, ok := h.readRunBody(w, r, &b, true)
	if !ok {
		return
	}
	if v := r.URL.Query().Get("force"); v != "" {
		f, err := strconv.ParseBool(v)
		if err != nil {
			h.fail(w, r, &runs.InputError{Field: "force", Msg: fmt.Sprintf("%q: want true or false", clipText(v, 20))})
			return
		}
		b.Force = b.Force || f
	}
	// Taking a run from the worker that holds it is an operator's act.
	if who := principalOf(r.Context()); b.Force && !who.scopes.Has(ScopeAdmin) {
		writeError(w, http.StatusForbidden, "forbidden", fmt.Sprintf("token %s lacks scope %s, which a forced resume needs", who.name, ScopeAdmin), "force")
		return
	}
	ctx, cancel := requestContext(r)
	defer cancel()
	res, err := h.client.Resume(ctx, runs.ResumeCommand{RunID: id, Force: b.Force})
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if res.Broke != "" {
		// A resume writes no event: the log is where a broken lease shows.
		h.log.Info("forced resume broke a lease", "run_id", id, "holder", res.Broke, "by", identity(r.Context()), "taken_by", res.TakenBy)
	}
	writeJSON(w, http.StatusOK, ResumeAnswer{OK: true, RunID: id, Broke: res.Broke, TakenBy: res.TakenBy})
}

// forkBody is POST /v1/runs/{id}/fork: the fork command without
// reply_to; run_id may be left out (it is in the path).
type forkBody struct {
	RunID    string          `json:"run_id,omitempty"`
	From     string          `json:"from"`
	Workflow json.RawMessage `json:"workflow,omitempty"`
	Input    json.RawMessage `json:"input,omitempty"`
	NewRunID string          `json:"new_run_id,omitempty"`
}

func (b *forkBody) bodyRun() string { return b.RunID }

func (h *handler) fork(w http.ResponseWriter, r *http.Request) {
	var b forkBody
	id, ok := h.readRunBody(w, r, &b, false)
	if !ok {
		return
	}
	ctx, cancel := requestContext(r)
	defer cancel()
	res, err := h.client.Fork(ctx, runs.ForkCommand{RunID: id, From: b.From, Workflow: b.Workflow, Input: b.Input,
		NewRunID: b.NewRunID, By: identity(r.Context())})
	h.forked(w, r, res, err)
}

// retryBody is POST /v1/runs/{id}/retry (optional).
type retryBody struct {
	RunID    string `json:"run_id,omitempty"`
	NewRunID string `json:"new_run_id,omitempty"`
}

func (b *retryBody) bodyRun() string { return b.RunID }

func (h *handler) retry(w http.ResponseWriter, r *http.Request) {
	var b retryBody
	id, ok := h.readRunBody(w, r, &b, true)
	if !ok {
		return
	}
	ctx, cancel := requestContext(r)
	defer cancel()
	res, err := h.client.Retry(ctx, runs.RetryCommand{RunID: id, NewRunID: b.NewRunID, By: identity(r.Context())})
	h.forked(w, r, res, err)
}

// forked answers a fork or retry: 201 with the new run's Location and
// what it copies and runs again.
func (h *handler) forked(w http.ResponseWriter, r *http.Request, res runs.ForkResult, err error) {
	if err != nil && res.RunID == "" {
		h.fail(w, r, err)
		return
	}
	if err != nil {
		h.log.Warn("forked run created but not queued", "run_id", res.RunID, "err", err)
	}
	w.Header().Set("Location", "/v1/runs/"+res.RunID)
	writeJSON(w, http.StatusCreated, res)
}

func clipText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
