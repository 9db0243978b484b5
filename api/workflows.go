package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/runs"
)

// The registry of deployed workflows over REST: PUT /v1/workflows/{name}
// deploys (scope deploy), GET /v1/workflows and GET /v1/workflows/{name}
// read (scope read). runs.Client does the work, as it does for the NATS
// service's pal.api.workflows.* and pal workflow.

// rightsOf is what the request's token may do, in runs' terms: its scopes
// start and deploy (admin has both). runs checks them, so REST keeps the
// rule every transport keeps.
func rightsOf(ctx context.Context) runs.Rights {
	who := principalOf(ctx)
	var r runs.Rights
	if who.scopes.Has(ScopeStart) {
		r |= runs.RightStart
	}
	if who.scopes.Has(ScopeDeploy) {
		r |= runs.RightDeploy
	}
	return r
}

// asToken words a refusal of runs for the request's token: 403 naming the
// token and the scope it lacks.
func asToken(ctx context.Context, err error) error {
	var fe *runs.ForbiddenError
	if errors.As(err, &fe) {
		return &forbiddenError{field: fe.Field, detail: fmt.Sprintf("token %s lacks scope %s: %v", principalOf(ctx).name, fe.Need, err)}
	}
	return err
}

// PUT /v1/workflows/{name}: the body is the workflow, whose name must be
// the path's. 201 for a new version, 200 when the content is the latest
// version's already; both answer {name, version, sha256}.
func (h *handler) deployWorkflow(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := event.ValidateWorkflowName(name); err != nil {
		h.fail(w, r, &runs.InputError{Field: "name", Msg: err.Error(), Err: err})
		return
	}
	body, empty, err := readBody(w, r)
	if err == nil && empty {
		err = &runs.InputError{Field: "workflow", Msg: "empty body: want the workflow definition"}
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	ctx, cancel := requestContext(r)
	defer cancel()
	res, err := h.client.Deploy(ctx, runs.DeployCommand{Workflow: body, Name: name, By: identity(ctx), Rights: rightsOf(ctx)})
	if err != nil {
		h.fail(w, r, asToken(ctx, err))
		return
	}
	status := http.StatusOK
	if res.Created {
		status = http.StatusCreated
		w.Header().Set("Location", "/v1/workflows/"+res.Name+"?version="+strconv.FormatUint(res.Version, 10))
	}
	writeJSON(w, status, res)
}

// GET /v1/workflows: the latest version of each deployed workflow.
func (h *handler) listWorkflows(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := requestContext(r)
	defer cancel()
	list, err := h.client.Workflows(ctx)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, list)
}

// GET /v1/workflows/{name}?version=N: one version (the latest without
// version) with its definition, and the list of versions.
func (h *handler) getWorkflow(w http.ResponseWriter, r *http.Request) {
	ref, err := runs.ParseWorkflowRef("name", r.PathValue("name"))
	if err == nil && ref.Version != 0 {
		err = &runs.InputError{Field: "name", Msg: "give the version as ?version=N"}
	}
	if v := r.URL.Query().Get("version"); err == nil && v != "" {
		if ref.Version, err = strconv.ParseUint(v, 10, 64); err != nil || ref.Version == 0 {
			err = &runs.InputError{Field: "version", Msg: fmt.Sprintf("%q: want a whole number from 1", clipText(v, 20))}
		}
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	ctx, cancel := requestContext(r)
	defer cancel()
	view, err := h.client.Workflow(ctx, ref)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, view)
}
