package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/runs"
	"github.com/palrun/pal/workflow"
)

// PAL as an MCP server (docs/architecture.md §9.9): tools that start and
// steer runs, each mapped onto runs.Client (the front door) as the REST
// routes are, with the caller's scopes held to the same rules. pal mcp
// serves them on stdio (acting as itself); the API address serves them
// on streamable HTTP at /mcp (stateless: every request carries its bearer
// token and is held to its scopes).

// MCP tool names.
const (
	MCPStartRun      = "start_run"
	MCPGetRun        = "get_run"
	MCPListApprovals = "list_approvals"
	MCPApprove       = "approve"
	MCPSignal        = "signal"
	MCPCancelRun     = "cancel_run"
)

// maxApprovalScan bounds the runs in flight list_approvals reads.
const maxApprovalScan = 500

// MCPCaller is who calls the MCP tools: a name (the approver, who starts,
// signals, cancels) and its scopes.
type MCPCaller struct {
	Name   string
	Scopes Scopes
}

// NewMCPServer returns an MCP server whose tools act for caller through
// client.
func NewMCPServer(client *runs.Client, caller MCPCaller) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "pal", Title: "PAL durable runs", Version: "1"}, nil)
	t := mcpTools{client: client, caller: caller}
	mcp.AddTool(s, &mcp.Tool{Name: MCPStartRun, Description: "Start a run of a deployed workflow (its name, or name@version) with input; " +
		"the same idempotency_key always maps to the same run. Needs scope start."}, t.start)
	mcp.AddTool(s, &mcp.Tool{Name: MCPGetRun, Description: "Get a run: its status, output or error, and its steps. Needs scope read."}, t.get)
	mcp.AddTool(s, &mcp.Tool{Name: MCPListApprovals, Description: "List the approval steps that wait for a decision, in the runs in flight. Needs scope read."}, t.approvals)
	mcp.AddTool(s, &mcp.Tool{Name: MCPApprove, Description: "Decide an approval step that waits: decision approve (the default) or reject. Needs scope approve."}, t.approve)
	mcp.AddTool(s, &mcp.Tool{Name: MCPSignal, Description: "Send a signal (a name and a JSON payload) to a run. Needs scope approve."}, t.signal)
	mcp.AddTool(s, &mcp.Tool{Name: MCPCancelRun, Description: "Cancel a run. Needs scope cancel."}, t.cancel)
	return s
}

// mcpHandler serves NewMCPServer on streamable HTTP for the request's
// token (its principal, set by requireToken).
func (h *handler) mcpHandler() http.Handler {
	return mcp.NewStreamableHTTPHandler(func(r *http.Request) *mcp.Server {
		who := principalOf(r.Context())
		return NewMCPServer(h.client, MCPCaller{Name: who.name, Scopes: who.scopes})
	}, &mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true, Logger: h.log})
}

// POST /mcp: the MCP endpoint; each tool checks its own scope.
// The body is bounded; the SDK's refusals (plain text) are answered as
// PAL's JSON errors.
func mcpRoute(h *handler, w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxMCPBody)
	jw := &jsonErrors{ResponseWriter: w}
	h.mcp.ServeHTTP(jw, r)
	jw.flush()
}

// jsonErrors turns an answer of status 400 or more whose body is not
// JSON into PAL's error body {"error", "detail"}.
type jsonErrors struct {
	http.ResponseWriter
	status int // an error being held, 0: passing through
	detail []byte
}

func (j *jsonErrors) WriteHeader(code int) {
	if code >= 400 && !strings.HasPrefix(j.Header().Get("Content-Type"), "application/json") {
		j.status = code
		return
	}
	j.ResponseWriter.WriteHeader(code)
}

func (j *jsonErrors) Write(b []byte) (int, error) {
	if j.status != 0 {
		if len(j.detail) < 1024 {
			j.detail = append(j.detail, b[:min(len(b), 1024-len(j.detail))]...)
		}
		return len(b), nil
	}
	return j.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection.
func (j *jsonErrors) Unwrap() http.ResponseWriter { return j.ResponseWriter }

// Flush passes a streamed answer on.
func (j *jsonErrors) Flush() {
	if f, ok := j.ResponseWriter.(http.Flusher); ok && j.status == 0 {
		f.Flush()
	}
}

func (j *jsonErrors) flush() {
	if j.status == 0 {
		return
	}
	code := "bad_request"
	switch j.status {
	case http.StatusRequestEntityTooLarge:
		code = codeTooLarge
	case http.StatusNotAcceptable:
		code = "not_acceptable"
	case http.StatusUnsupportedMediaType:
		code = "unsupported_media_type"
	}
	j.Header().Del("Content-Length")
	writeError(j.ResponseWriter, j.status, code, strings.TrimSpace(string(j.detail)), "")
}

// maxMCPBody bounds a POST /mcp body.
const maxMCPBody = 1 << 20

type mcpTools struct {
	client *runs.Client
	caller MCPCaller
}

// need refuses a tool to a caller without scope s, as REST words it.
func (t mcpTools) need(s Scopes) error {
	if !t.caller.Scopes.Has(s) {
		return fmt.Errorf("forbidden: token %s lacks scope %s", t.caller.Name, s)
	}
	return nil
}

// ctx is ctx with the caller named for runs' limits.
func (t mcpTools) ctx(ctx context.Context) context.Context {
	return runs.WithCaller(ctx, t.caller.Name)
}

// mcpResult is a tool's result: v as JSON, in text and as structured content.
func mcpResult(v any) (*mcp.CallToolResult, any, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, nil, err
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(b)}}, StructuredContent: json.RawMessage(b)}, nil, nil
}

// StartRunArgs are start_run's arguments.
type StartRunArgs struct {
	Workflow       string            `json:"workflow" jsonschema:"a deployed workflow: name (its latest version) or name@version"`
	Input          any               `json:"input,omitempty" jsonschema:"the run's input, any JSON value"`
	IdempotencyKey string            `json:"idempotency_key,omitempty" jsonschema:"the same key always maps to the same run, created once"`
	Labels         map[string]string `json:"labels,omitempty" jsonschema:"labels of the run"`
}

func (t mcpTools) start(ctx context.Context, _ *mcp.CallToolRequest, in StartRunArgs) (*mcp.CallToolResult, any, error) {
	if err := t.need(ScopeStart); err != nil {
		return nil, nil, err
	}
	if _, err := runs.ParseWorkflowRef("workflow", in.Workflow); err != nil {
		return nil, nil, err
	}
	ref, _ := json.Marshal(in.Workflow)
	var input json.RawMessage
	if in.Input != nil {
		b, err := json.Marshal(in.Input)
		if err != nil {
			return nil, nil, fmt.Errorf("input: %w", err)
		}
		input = b
	}
	var rights runs.Rights
	if t.caller.Scopes.Has(ScopeStart) {
		rights |= runs.RightStart
	}
	res, err := t.client.Start(t.ctx(ctx), runs.StartCommand{Workflow: ref, Input: input, IdempotencyKey: in.IdempotencyKey,
		Labels: in.Labels, By: t.caller.Name, Rights: rights})
	if err != nil && res.RunID == "" {
		return nil, nil, err
	}
	return mcpResult(StartAnswer{RunID: res.RunID, Created: res.Created})
}

// RunArgs name a run.
type RunArgs struct {
	RunID string `json:"run_id" jsonschema:"the run's id"`
}

func (t mcpTools) get(ctx context.Context, _ *mcp.CallToolRequest, in RunArgs) (*mcp.CallToolResult, any, error) {
	if err := t.need(ScopeRead); err != nil {
		return nil, nil, err
	}
	v, err := t.client.Get(t.ctx(ctx), in.RunID)
	if err != nil {
		return nil, nil, err
	}
	return mcpResult(v)
}

// WaitingApproval is an approval step that waits for a decision.
type WaitingApproval struct {
	RunID    string          `json:"run_id"`
	Workflow string          `json:"workflow,omitempty"`
	StepID   string          `json:"step_id"`
	Input    json.RawMessage `json:"input,omitempty"`
	Since    string          `json:"waiting_since,omitempty"`
}

// ApprovalList is list_approvals' answer; Truncated when more runs were
// in flight than it read (maxApprovalScan).
type ApprovalList struct {
	Approvals []WaitingApproval `json:"approvals"`
	Truncated bool              `json:"truncated,omitempty"`
}

func (t mcpTools) approvals(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
	if err := t.need(ScopeRead); err != nil {
		return nil, nil, err
	}
	ctx = t.ctx(ctx)
	inflight, err := t.client.Store().InflightRuns(ctx)
	if err != nil {
		return nil, nil, err
	}
	out := ApprovalList{Approvals: []WaitingApproval{}}
	if len(inflight) > maxApprovalScan {
		inflight, out.Truncated = inflight[:maxApprovalScan], true
	}
	for _, r := range inflight {
		v, err := t.client.Get(ctx, r.RunID)
		if err != nil || v.Status != engine.StatusWaiting {
			continue // ended meanwhile, or not waiting
		}
		for _, s := range v.Steps {
			if s.NodeType == workflow.TypeApproval && s.Status == engine.StepWaiting {
				out.Approvals = append(out.Approvals, WaitingApproval{RunID: v.RunID, Workflow: v.Workflow, StepID: s.StepID,
					Input: s.Input, Since: s.WaitingSince})
			}
		}
	}
	return mcpResult(out)
}

// ApproveArgs are approve's arguments.
type ApproveArgs struct {
	RunID    string `json:"run_id" jsonschema:"the run's id"`
	StepID   string `json:"step_id" jsonschema:"the approval step's id"`
	Decision string `json:"decision,omitempty" jsonschema:"approve (the default) or reject"`
	Comment  string `json:"comment,omitempty" jsonschema:"recorded with the decision"`
}

func (t mcpTools) approve(ctx context.Context, _ *mcp.CallToolRequest, in ApproveArgs) (*mcp.CallToolResult, any, error) {
	if err := t.need(ScopeApprove); err != nil {
		return nil, nil, err
	}
	if in.Decision == "" {
		in.Decision = "approve"
	}
	c := runs.ApproveCommand{RunID: in.RunID, StepID: in.StepID, Decision: in.Decision, Comment: in.Comment, Approver: t.caller.Name}
	if err := c.Validate(); err != nil {
		return nil, nil, err
	}
	if err := t.client.Approve(t.ctx(ctx), c); err != nil {
		return nil, nil, err
	}
	return mcpResult(OKAnswer{OK: true, RunID: in.RunID})
}

// SignalArgs are signal's arguments.
type SignalArgs struct {
	RunID   string `json:"run_id" jsonschema:"the run's id"`
	Name    string `json:"name" jsonschema:"the signal's name"`
	Payload any    `json:"payload,omitempty" jsonschema:"the signal's payload, any JSON value"`
}

func (t mcpTools) signal(ctx context.Context, _ *mcp.CallToolRequest, in SignalArgs) (*mcp.CallToolResult, any, error) {
	if err := t.need(ScopeApprove); err != nil {
		return nil, nil, err
	}
	c := runs.SignalCommand{RunID: in.RunID, Signal: in.Name, By: t.caller.Name}
	if in.Payload != nil {
		b, err := json.Marshal(in.Payload)
		if err != nil {
			return nil, nil, fmt.Errorf("payload: %w", err)
		}
		c.Payload = b
	}
	if err := t.client.Signal(t.ctx(ctx), c); err != nil {
		return nil, nil, err
	}
	return mcpResult(OKAnswer{OK: true, RunID: in.RunID})
}

// CancelArgs are cancel_run's arguments.
type CancelArgs struct {
	RunID  string `json:"run_id" jsonschema:"the run's id"`
	Reason string `json:"reason,omitempty" jsonschema:"why, recorded with the cancel"`
}

func (t mcpTools) cancel(ctx context.Context, _ *mcp.CallToolRequest, in CancelArgs) (*mcp.CallToolResult, any, error) {
	if err := t.need(ScopeCancel); err != nil {
		return nil, nil, err
	}
	if err := t.client.Cancel(t.ctx(ctx), runs.CancelCommand{RunID: in.RunID, Reason: in.Reason, By: t.caller.Name}); err != nil {
		return nil, nil, err
	}
	return mcpResult(OKAnswer{OK: true, RunID: in.RunID})
}
