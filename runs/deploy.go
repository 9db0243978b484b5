package runs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/workflow"
)

// The registry of deployed workflows (eventstore.WorkflowBucket): a start
// names one ("workflow": "triage" for the latest version, "triage@3" for
// one), and its run_created journals that version's definition with its
// name, version and sha256 (event.Deployed), so a run never changes under
// a redeploy. A start that brings its own definition deploys it first,
// which takes RightDeploy.

// ErrWorkflowNotFound: no workflow is deployed under the name, or it has
// no such version (404).
var ErrWorkflowNotFound = eventstore.ErrWorkflowNotFound

// DeployCommand deploys a workflow: PUT /v1/workflows/{name},
// pal.api.workflows.deploy, pal workflow deploy.
type DeployCommand struct {
	// Workflow is the definition; its name is what it is deployed under.
	Workflow json.RawMessage
	// Name, when set (REST's path), must be the definition's name.
	Name string
	// By names who deploys; Rights what the caller may do (RightDeploy
	// needed).
	By     string
	Rights Rights
}

// DeployResult names the version a deploy made or found: PUT
// /v1/workflows/{name} answers it, pal workflow deploy prints it as
// NAME@VERSION.
type DeployResult struct {
	Name    string `json:"name"`
	Version uint64 `json:"version"`
	SHA256  string `json:"sha256"`
	// Created is false when the definition was the latest version's
	// already: nothing was written.
	Created bool `json:"-"`
}

// Ref is the result as a start names it: NAME@VERSION.
func (r DeployResult) Ref() string { return r.Name + "@" + strconv.FormatUint(r.Version, 10) }

// Deploy validates a workflow and deploys it under its name: the next
// version when its content (the sha256 of its compact JSON) is new, the
// latest version unchanged otherwise.
//
// Errors: *ForbiddenError without RightDeploy; *InputError (no
// definition, a name that is not a deployable one, a name other than
// cmd.Name); *workflow.ValidationError; ErrPayloadTooLarge.
func (c *Client) Deploy(ctx context.Context, cmd DeployCommand) (_ DeployResult, err error) {
	defer observeRefusal(CmdDeploy, &err)
	if err := need(cmd.Rights, RightDeploy, "workflow", whatDeploy); err != nil {
		return DeployResult{}, err
	}
	raw := bytes.TrimSpace(cmd.Workflow)
	if len(raw) == 0 || raw[0] != '{' {
		return DeployResult{}, &InputError{Field: "workflow", Msg: "want the workflow definition, a JSON object"}
	}
	if len(raw) > MaxCommandBytes {
		return DeployResult{}, &InputError{Field: "workflow", Msg: fmt.Sprintf("%d bytes; the limit is %d", len(raw), MaxCommandBytes)}
	}
	_, d, err := c.deploy(ctx, raw, cmd.By, cmd.Name)
	if err != nil {
		return DeployResult{}, err
	}
	return DeployResult{Name: d.Name, Version: d.Version, SHA256: d.SHA256, Created: d.created}, nil
}

// deployed is a version a deploy made or found.
type deployed struct {
	event.Deployed
	created bool
}

// deploy parses and validates raw and deploys it by by; want, when not
// "", is the name the caller expects it to have.
func (c *Client) deploy(ctx context.Context, raw json.RawMessage, by, want string) (*workflow.Workflow, deployed, error) {
	wf, err := workflow.ParseCached(raw)
	if err != nil {
		return nil, deployed{}, err
	}
	if err := event.ValidateWorkflowName(wf.Name); err != nil {
		return nil, deployed{}, &InputError{Field: "workflow.name", Msg: err.Error() + "; a deployed workflow's name is its key", Err: err}
	}
	if want != "" && wf.Name != want {
		return nil, deployed{}, &InputError{Field: "workflow.name", Msg: fmt.Sprintf("%q is not the name the request deploys it as (%s)", truncate(wf.Name, 80), want)}
	}
	if by == "" {
		by = "pal"
	}
	d, created, err := c.store.DeployWorkflow(ctx, wf.Name, wf.Raw(), by)
	if err != nil {
		return nil, deployed{}, err
	}
	return wf, deployed{Deployed: d.Deployed, created: created}, nil
}

// resolve returns the deployed version ref names and its parsed
// definition.
func (c *Client) resolve(ctx context.Context, ref WorkflowRef) (*workflow.Workflow, event.Deployed, error) {
	d, err := c.store.DeployedWorkflow(ctx, ref.Name, ref.Version)
	if err != nil {
		return nil, event.Deployed{}, err
	}
	wf, err := workflow.ParseCached(d.Definition)
	if err != nil {
		return nil, event.Deployed{}, fmt.Errorf("workflow %s no longer validates: %w", d.Deployed, err)
	}
	return wf, d.Deployed, nil
}

// WorkflowRef names a deployed workflow: NAME (the latest version, Version
// 0) or NAME@VERSION.
type WorkflowRef struct {
	Name    string
	Version uint64
}

func (r WorkflowRef) String() string {
	if r.Version == 0 {
		return r.Name
	}
	return r.Name + "@" + strconv.FormatUint(r.Version, 10)
}

// ParseWorkflowRef reads NAME or NAME@VERSION (VERSION a whole number
// from 1). Errors: *InputError naming field.
func ParseWorkflowRef(field, s string) (WorkflowRef, error) {
	name, ver, hasVer := strings.Cut(s, "@")
	if err := event.ValidateWorkflowName(name); err != nil {
		return WorkflowRef{}, &InputError{Field: field, Msg: err.Error() + " (want NAME or NAME@VERSION)", Err: err}
	}
	ref := WorkflowRef{Name: name}
	if hasVer {
		v, err := strconv.ParseUint(ver, 10, 64)
		if err != nil || v == 0 || strings.HasPrefix(ver, "+") {
			return WorkflowRef{}, &InputError{Field: field, Msg: fmt.Sprintf("version %q: want a whole number from 1 (NAME@VERSION)", truncate(ver, 40))}
		}
		ref.Version = v
	}
	return ref, nil
}

// WorkflowView is a deployed workflow as GET /v1/workflows/{name},
// pal.api.workflows.get and pal workflow get answer it: one version with
// its definition, and every version's number and time.
type WorkflowView struct {
	Name    string `json:"name"`
	Version uint64 `json:"version"`
	SHA256  string `json:"sha256"`
	By      string `json:"by,omitempty"`
	// DeployedAt is when the version was deployed (RFC 3339, UTC).
	DeployedAt string          `json:"deployed_at"`
	Workflow   json.RawMessage `json:"workflow,omitempty"`
	// Latest is the latest version's number.
	Latest   uint64            `json:"latest,omitempty"`
	Versions []WorkflowVersion `json:"versions,omitempty"`
}

// WorkflowVersion is one version in a WorkflowView's list, newest first.
type WorkflowVersion struct {
	Version    uint64 `json:"version"`
	DeployedAt string `json:"deployed_at"`
}

// WorkflowList is every deployed workflow's latest version, by name: GET
// /v1/workflows, pal.api.workflows.list, pal workflow list.
type WorkflowList struct {
	Workflows []WorkflowView `json:"workflows"`
}

// Workflow returns the deployed version ref names (the latest for
// version 0), its definition and the list of versions.
//
// Errors: *InputError, ErrWorkflowNotFound.
func (c *Client) Workflow(ctx context.Context, ref WorkflowRef) (*WorkflowView, error) {
	if err := event.ValidateWorkflowName(ref.Name); err != nil {
		return nil, &InputError{Field: "name", Msg: err.Error(), Err: err}
	}
	d, err := c.store.DeployedWorkflow(ctx, ref.Name, ref.Version)
	if err != nil {
		return nil, err
	}
	versions, err := c.store.WorkflowVersions(ctx, ref.Name)
	if err != nil {
		return nil, err
	}
	v := &WorkflowView{Name: d.Name, Version: d.Version, SHA256: d.SHA256, By: d.By, DeployedAt: FormatTime(d.At),
		Workflow: d.Definition, Versions: make([]WorkflowVersion, 0, len(versions))}
	for _, x := range versions {
		v.Versions = append(v.Versions, WorkflowVersion{Version: x.Version, DeployedAt: FormatTime(x.At)})
		v.Latest = max(v.Latest, x.Version)
	}
	return v, nil
}

// Workflows lists the latest version of every deployed workflow, by name,
// without definitions.
func (c *Client) Workflows(ctx context.Context) (*WorkflowList, error) {
	ds, err := c.store.DeployedWorkflows(ctx)
	if err != nil {
		return nil, err
	}
	out := &WorkflowList{Workflows: make([]WorkflowView, 0, len(ds))}
	for _, d := range ds {
		out.Workflows = append(out.Workflows, WorkflowView{Name: d.Name, Version: d.Version, SHA256: d.SHA256, By: d.By,
			DeployedAt: FormatTime(d.At), Latest: d.Version})
	}
	return out, nil
}

// errWorkflowNotFound reports whether err is a workflow not deployed.
func errWorkflowNotFound(err error) bool { return errors.Is(err, ErrWorkflowNotFound) }
