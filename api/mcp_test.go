package api_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/api"
	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/paltest/testenv"
	"github.com/palrun/pal/runs"
)

// bearerTransport sends a bearer token with each request.
type bearerTransport struct{ token string }

func (b bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

// mcpSession connects the SDK's MCP client to POST /mcp with token.
func (b *bundle) mcpSession(t *testing.T, token string) *mcp.ClientSession {
	t.Helper()
	client := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	sess, err := client.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: b.url + "/mcp",
		HTTPClient: &http.Client{Transport: bearerTransport{token}, Timeout: 30 * time.Second}, DisableStandaloneSSE: true}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sess.Close() })
	return sess
}

// gateWorkflow waits for approval "ok", then echoes its input.
const gateWorkflow = `{"name":"gate","nodes":[{"id":"start","type":"trigger"},
	{"id":"ok","type":"approval","data":{"prompt":"ship {{input.v}}?"}},
	{"id":"done","type":"tool","data":{"tool":"echo","input":{"v":"{{input.v}}"}}}],
	"edges":[{"from":"start","to":"ok"},{"from":"ok","to":"done"}]}`

// callMCP calls tool with args and decodes its structured answer into
// out; it returns the result for its IsError.
func callMCP(t *testing.T, sess *mcp.ClientSession, tool string, args any, out any) *mcp.CallToolResult {
	t.Helper()
	res, err := sess.CallTool(context.Background(), &mcp.CallToolParams{Name: tool, Arguments: args})
	require.NoError(t, err)
	if out != nil && !res.IsError {
		b, err := json.Marshal(res.StructuredContent)
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal(b, out))
	}
	return res
}

func errorText(res *mcp.CallToolResult) string {
	if len(res.Content) == 0 {
		return ""
	}
	if tc, ok := res.Content[0].(*mcp.TextContent); ok {
		return tc.Text
	}
	return ""
}

// mcpDrivesAnApproval is the walk every transport of pal mcp must pass:
// the SDK's client lists the tools, starts a run of a deployed workflow,
// sees it wait for approval, approves it and sees it succeed. It returns
// the run's id.
func mcpDrivesAnApproval(t *testing.T, sess *mcp.ClientSession) string {
	t.Helper()
	tools, err := sess.ListTools(context.Background(), nil)
	require.NoError(t, err)
	var names []string
	for _, tl := range tools.Tools {
		names = append(names, tl.Name)
	}
	slices.Sort(names)
	require.Equal(t, []string{api.MCPApprove, api.MCPCancelRun, api.MCPGetRun, api.MCPListApprovals, api.MCPSignal, api.MCPStartRun}, names)

	var started api.StartAnswer
	res := callMCP(t, sess, api.MCPStartRun, map[string]any{"workflow": "gate", "input": map[string]any{"v": "v2"}}, &started)
	require.False(t, res.IsError, errorText(res))
	require.True(t, started.Created)
	require.Eventually(t, func() bool {
		var list api.ApprovalList
		callMCP(t, sess, api.MCPListApprovals, map[string]any{}, &list)
		return slices.ContainsFunc(list.Approvals, func(a api.WaitingApproval) bool {
			return a.RunID == started.RunID && a.StepID == "ok" && a.Workflow == "gate"
		})
	}, time.Minute, 50*time.Millisecond, "the run waits for approval")

	var ok api.OKAnswer
	res = callMCP(t, sess, api.MCPApprove, map[string]any{"run_id": started.RunID, "step_id": "ok", "comment": "ship it"}, &ok)
	require.False(t, res.IsError, errorText(res))
	require.True(t, ok.OK)
	require.Eventually(t, func() bool {
		var v runs.RunView
		callMCP(t, sess, api.MCPGetRun, map[string]any{"run_id": started.RunID}, &v)
		return v.Status == engine.StatusSucceeded && string(v.Output) != ""
	}, time.Minute, 50*time.Millisecond, "the run succeeds")
	return started.RunID
}

// TestMCPOverHTTP: the SDK's MCP client on POST /mcp with a token of the
// default scopes starts a run of a deployed workflow, sees it wait for
// approval, approves it and sees it succeed; a read-only token may list
// and read but is refused start_run, approve, signal and cancel_run
// (naming the scope), and nothing it asked is journaled; a request
// without a token is 401.
func TestMCPOverHTTP(t *testing.T) {
	t.Parallel()
	b := setup(t, withWorker(), withTokens([]api.Token{{Name: "ci", Secret: testToken}, {Name: "viewer", Secret: "tok-viewer", Scopes: api.ScopeRead}}, false))
	b.Deploy(t, gateWorkflow)
	mcpDrivesAnApproval(t, b.mcpSession(t, testToken))

	// A run the viewer sees waiting, and may not decide.
	ci := b.mcpSession(t, testToken)
	var started api.StartAnswer
	callMCP(t, ci, api.MCPStartRun, map[string]any{"workflow": "gate", "input": map[string]any{"v": "v3"}}, &started)
	viewer := b.mcpSession(t, "tok-viewer")
	require.Eventually(t, func() bool {
		var list api.ApprovalList
		callMCP(t, viewer, api.MCPListApprovals, map[string]any{}, &list)
		return slices.ContainsFunc(list.Approvals, func(a api.WaitingApproval) bool { return a.RunID == started.RunID })
	}, time.Minute, 50*time.Millisecond)
	before := b.Events(t, started.RunID)
	for tool, args := range map[string]map[string]any{
		api.MCPApprove:   {"run_id": started.RunID, "step_id": "ok"},
		api.MCPStartRun:  {"workflow": "gate"},
		api.MCPSignal:    {"run_id": started.RunID, "name": "go"},
		api.MCPCancelRun: {"run_id": started.RunID},
	} {
		res := callMCP(t, viewer, tool, args, nil)
		require.True(t, res.IsError, tool)
		require.Contains(t, errorText(res), "forbidden: token viewer lacks scope", tool)
	}
	require.Len(t, b.Events(t, started.RunID), len(before), "a refused tool wrote nothing")
	var v runs.RunView
	callMCP(t, viewer, api.MCPGetRun, map[string]any{"run_id": started.RunID}, &v)
	require.Equal(t, engine.StatusWaiting, v.Status)

	res := b.do(t, http.MethodPost, "/mcp", nil, "Authorization", "")
	require.Equal(t, http.StatusUnauthorized, res.status)
}

// TestMCPOverStdio: the SDK's MCP client starts `pal mcp --as ana` (the
// binary, over its stdin and stdout) and walks the same approval; the
// decision is journaled as ana's.
func TestMCPOverStdio(t *testing.T) {
	t.Parallel()
	b := setup(t, withWorker())
	b.Deploy(t, gateWorkflow)
	var err error
	cmd := exec.Command(testenv.PalBinary(t), "mcp", "--as", "ana")
	cmd.Dir = t.TempDir() // no pal dev's dev.env above it
	cmd.Env = append(os.Environ(), "PAL_NATS_URL="+b.NATS.URL(), "PAL_LOG_LEVEL=debug")
	logs, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	require.NoError(t, err)
	defer logs.Close()
	cmd.Stderr = logs // a file: no goroutine copies it
	stderr := func() string { b, _ := os.ReadFile(logs.Name()); return string(b) }
	client := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	sess, err := client.Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, nil)
	require.NoError(t, err, stderr())
	runID := mcpDrivesAnApproval(t, sess)
	require.NoError(t, sess.Close())
	var approver string
	for _, ev := range b.Events(t, runID) {
		if ev.Kind == event.ApprovalReceived {
			var d event.ApprovalReceivedData
			require.NoError(t, ev.DecodeData(&d))
			approver = d.Approver
		}
	}
	require.Equal(t, "ana", approver)
}
