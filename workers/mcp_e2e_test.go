package workers_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/paltest/testenv"
	"github.com/palrun/pal/provider"
	"github.com/palrun/pal/provider/providertest"
	"github.com/palrun/pal/workers"
)

// ticketsState is what examples/mcp/tickets keeps in DIR/tickets.json.
type ticketsState struct {
	Tickets []struct {
		ID    int    `json:"id"`
		Title string `json:"title"`
		Key   string `json:"key"`
	} `json:"tickets"`
	Calls []struct {
		Tool string `json:"tool"`
		Key  string `json:"key"`
	} `json:"calls"`
}

func readTickets(t *testing.T, dir string) ticketsState {
	t.Helper()
	var st ticketsState
	b, err := os.ReadFile(filepath.Join(dir, "tickets.json"))
	if os.IsNotExist(err) {
		return st
	}
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &st))
	return st
}

// ticketsBinary is examples/mcp/tickets, built for the test.
func ticketsBinary(t *testing.T) string { return testenv.BuildBinary(t, "./examples/mcp/tickets") }

// mcpConfigFile writes a PAL_MCP_CONFIG file of servers (the value of
// mcpServers) and returns its path.
func mcpConfigFile(t *testing.T, servers map[string]any) string {
	t.Helper()
	b, err := json.Marshal(map[string]any{"mcpServers": servers})
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "mcp.json")
	require.NoError(t, os.WriteFile(path, b, 0o644))
	return path
}

// ticketAgent is a workflow whose agent "ask" offers tools of the MCP
// server tickets.
func ticketAgent(tools string) string {
	return fmt.Sprintf(`{"name":"tickets-agent","nodes":[{"id":"start","type":"trigger"},
	{"id":"ask","type":"agent","data":{"provider":"openai","model":"m","prompt":"file a ticket about {{input.topic}}","tools":%s}}],
	"edges":[{"from":"start","to":"ask"}]}`, tools)
}

// fileTicket answers an agent: first a call of create_ticket, then, once
// a tool result is in the conversation, a final answer quoting it.
func fileTicket(c providertest.Call) providertest.Reply {
	for _, m := range c.Messages {
		if m.Role == provider.RoleTool {
			return providertest.Reply{Text: "filed: " + m.Content}
		}
	}
	return providertest.Reply{ToolCalls: []provider.ToolCall{{ID: "call_1", Name: "create_ticket",
		Arguments: json.RawMessage(`{"title":"printer on fire"}`)}}}
}

// toolsOfTurn returns the tools the model was offered on the turn that
// carried a tool result (the agent's second turn).
func toolsOfSecondTurn(t *testing.T, llm *providertest.Server) []string {
	t.Helper()
	for _, c := range llm.Calls() {
		for _, m := range c.Messages {
			if m.Role == provider.RoleTool {
				tools := slices.Clone(c.Tools)
				slices.Sort(tools)
				return tools
			}
		}
	}
	t.Fatal("no turn carried a tool result")
	return nil
}

// requireOnceWithOneKey checks the tickets server saw create_ticket twice
// with the step's key (the call held when the worker died, and again
// after the takeover) and made one ticket.
func requireOnceWithOneKey(t *testing.T, dir, want string) {
	t.Helper()
	st := readTickets(t, dir)
	require.Len(t, st.Calls, 2, "%+v", st)
	for _, c := range st.Calls {
		require.Equal(t, "create_ticket", c.Tool)
		require.Equal(t, want, c.Key)
	}
	require.Len(t, st.Tickets, 1, "%+v", st)
	require.Equal(t, "printer on fire", st.Tickets[0].Title)
}

// TestMCPStdioCallSurvivesKill: an agent's model calls create_ticket of
// a stdio MCP server (in the sandbox of a real pal worker); the worker is
// killed (-9) while the call is held in the server, which dies with it.
// After the takeover the new server sees the call again with the same
// pal/idempotencyKey, the ticket exists once, and the run succeeds. The
// new worker's server lists one more tool, and the resumed agent is
// offered the list its first turn journaled, not the new one.
func TestMCPStdioCallSurvivesKill(t *testing.T) {
	t.Parallel()
	p := setupProc(t, time.Second)
	p.LLM.SetResponder(fileTicket)
	bin := ticketsBinary(t)
	dir := sharedDir(t)
	hold := filepath.Join(dir, "hold")
	require.NoError(t, os.WriteFile(hold, nil, 0o644))
	mounts := "PAL_PROCESS_MOUNTS=" + dir + ":rw"
	cfg1 := mcpConfigFile(t, map[string]any{"tickets": map[string]any{"command": bin, "args": []string{"-dir", dir, "-hold", hold}}})
	w1 := p.palWorker(t, "w1", "PAL_MCP_CONFIG="+cfg1, mounts)

	runID := p.startWithID(t, ticketAgent(`[{"mcp":"tickets"}]`), `{"topic":"the printer"}`)
	require.Eventually(t, func() bool { return len(readTickets(t, dir).Calls) == 1 }, time.Minute, 20*time.Millisecond, w1.Output())
	w1.Kill()
	require.NoError(t, os.Remove(hold))

	cfg2 := mcpConfigFile(t, map[string]any{"tickets": map[string]any{"command": bin, "args": []string{"-dir", dir, "-extra", "delete_all"}}})
	w2 := p.palWorker(t, "w2", "PAL_MCP_CONFIG="+cfg2, mounts)
	end := p.WaitEnd(t, runID)
	require.Equal(t, event.RunSucceeded, end.Kind, "%s\n%s", end.Data, w2.Output())

	requireOnceWithOneKey(t, dir, key(runID, "ask.turn[0].tool[0]", 1))
	require.Equal(t, []string{"create_ticket", "search"}, toolsOfSecondTurn(t, p.LLM), "the journaled list, without delete_all")
	var out struct{ Text string }
	require.NoError(t, json.Unmarshal(data[event.RunSucceededData](t, end).Output, &out))
	require.Contains(t, out.Text, "printer on fire")

	// The live worker announces its MCP server (pal workers); the killed
	// one is not listed.
	var listed []struct {
		WorkerID string   `json:"worker_id"`
		MCP      []string `json:"mcp"`
	}
	require.NoError(t, json.Unmarshal([]byte(p.palCLI(t, "workers", "--json")), &listed))
	require.Len(t, listed, 1)
	require.Equal(t, "w2", listed[0].WorkerID)
	require.Equal(t, []string{"tickets"}, listed[0].MCP)
}

// TestMCPHTTPCallSurvivesKill: the same with a streamable-HTTP MCP
// server (a process of its own, which the kill leaves running), reached
// through the egress policy with a header that holds a secret bound to
// its host; allow offers two of its three tools.
func TestMCPHTTPCallSurvivesKill(t *testing.T) {
	t.Parallel()
	p := setupProc(t, time.Second)
	p.LLM.SetResponder(fileTicket)
	dir := sharedDir(t)
	hold := filepath.Join(dir, "hold")
	require.NoError(t, os.WriteFile(hold, nil, 0o644))
	addr := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
	srv := testenv.StartProcess(t, ticketsBinary(t), []string{"-dir", dir, "-http", addr, "-hold", hold, "-token", "s3cret", "-extra", "delete_all"}, nil)
	ctx := ctxFor(t, time.Minute)
	require.NoError(t, srv.WaitForOutput(ctx, "serving MCP"), srv.Output())
	cfg := mcpConfigFile(t, map[string]any{"tickets": map[string]any{"url": "http://" + addr + "/mcp",
		"headers": map[string]string{"Authorization": "Bearer {{secrets.TICKETS}}"}}})
	env := []string{"PAL_MCP_CONFIG=" + cfg, "PAL_SECRET_TICKETS=s3cret", "PAL_SECRET_TICKETS_HOSTS=127.0.0.1"}
	w1 := p.palWorker(t, "w1", env...)

	runID := p.startWithID(t, ticketAgent(`[{"mcp":"tickets","allow":["create_ticket","search"]}]`), `{"topic":"the printer"}`)
	require.Eventually(t, func() bool { return len(readTickets(t, dir).Calls) == 1 }, time.Minute, 20*time.Millisecond, w1.Output())
	w1.Kill()
	require.NoError(t, os.Remove(hold))
	w2 := p.palWorker(t, "w2", env...)
	end := p.WaitEnd(t, runID)
	require.Equal(t, event.RunSucceeded, end.Kind, "%s\n%s", end.Data, w2.Output())
	requireOnceWithOneKey(t, dir, key(runID, "ask.turn[0].tool[0]", 1))
	require.Equal(t, []string{"create_ticket", "search"}, toolsOfSecondTurn(t, p.LLM))
	for _, ev := range p.Events(t, runID) {
		require.NotContains(t, string(ev.Data), "s3cret", "%s", ev.Kind)
	}
}

// mcpToolNode is a workflow of one tool node calling tool of MCP server
// tickets with arguments.
func mcpToolNode(tool, arguments string, extra string) string {
	return fmt.Sprintf(`{"name":"mcp-tool","nodes":[{"id":"start","type":"trigger"},
	{"id":"call","type":"tool","data":{"mcp":"tickets","tool":%q,"arguments":%s%s}}],
	"edges":[{"from":"start","to":"call"}]}`, tool, arguments, extra)
}

// TestMCPEgressRefusesForbiddenAddress: a worker whose egress policy is
// PAL's default refuses an MCP server on loopback: the step fails, not
// retried, naming the refusal, and the server never sees a request.
func TestMCPEgressRefusesForbiddenAddress(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dir := sharedDir(t)
	addr := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
	srv := testenv.StartProcess(t, ticketsBinary(t), []string{"-dir", dir, "-http", addr}, nil)
	require.NoError(t, srv.WaitForOutput(ctxFor(t, time.Minute), "serving MCP"), srv.Output())
	cfg, err := workers.ParseMCPConfig([]byte(`{"mcpServers":{"tickets":{"url":"http://` + addr + `/mcp"}}}`))
	require.NoError(t, err)
	b.Worker(t, "w1", paltest.Egress(nil), paltest.MCP(cfg))
	runID := b.Start(t, mcpToolNode("create_ticket", `{"title":"x"}`, `,"retry":{"maxAttempts":3,"backoffMs":1,"retryableClasses":["any"]}`), `{}`)
	end := b.WaitEnd(t, runID)
	require.Equal(t, event.RunFailed, end.Kind)
	f := data[event.RunFailedData](t, end)
	require.Contains(t, f.Error, "egress")
	require.Contains(t, f.Error, "MCP server tickets")
	require.Empty(t, readTickets(t, dir).Calls)
	attempts := 0
	for _, ev := range b.Events(t, runID) {
		if ev.Kind == event.StepStarted {
			attempts++
		}
	}
	require.Equal(t, 1, attempts, "a refused address is not retried")
}

// TestMCPExampleWorkflow: examples/mcp/agent.json runs as the README
// says, with examples/mcp/tickets as the stdio server tickets: the agent
// creates the ticket through MCP, and the tool node's search finds it.
func TestMCPExampleWorkflow(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), "examples", "mcp", "agent.json"))
	require.NoError(t, err)
	dir := sharedDir(t)
	cfg, err := workers.LoadMCPConfig(mcpConfigFile(t, map[string]any{"tickets": map[string]any{"command": ticketsBinary(t), "args": []string{"-dir", dir}}}))
	require.NoError(t, err)
	b := setup(t)
	b.LLM.SetResponder(fileTicket)
	b.Worker(t, "w1", paltest.MCP(cfg), paltest.Sandbox(runner(t, dir+":rw")))
	runID := b.Start(t, string(raw), `{"issue":"printer"}`)
	end := b.WaitEnd(t, runID)
	require.Equal(t, event.RunSucceeded, end.Kind, "%s", end.Data)
	st := readTickets(t, dir)
	require.Len(t, st.Tickets, 1)
	require.Equal(t, key(runID, "triage.turn[0].tool[0]", 1), st.Tickets[0].Key)
	var out struct { // the last step's, check's
		StructuredContent struct {
			Tickets []struct{ Title string } `json:"tickets"`
		} `json:"structuredContent"`
	}
	require.NoError(t, json.Unmarshal(data[event.RunSucceededData](t, end).Output, &out))
	require.Len(t, out.StructuredContent.Tickets, 1, "%s", data[event.RunSucceededData](t, end).Output)
	require.Equal(t, "printer on fire", out.StructuredContent.Tickets[0].Title)
}

// TestMCPSecretGoesOnlyToItsHosts: an HTTP MCP server's header holds a
// secret bound to another host: nothing is sent to the server, and the
// step fails without a retry naming the secret, not its value.
func TestMCPSecretGoesOnlyToItsHosts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dir := sharedDir(t)
	addr := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
	srv := testenv.StartProcess(t, ticketsBinary(t), []string{"-dir", dir, "-http", addr}, nil)
	require.NoError(t, srv.WaitForOutput(ctxFor(t, time.Minute), "serving MCP"), srv.Output())
	cfg, err := workers.ParseMCPConfig([]byte(`{"mcpServers":{"tickets":{"url":"http://` + addr + `/mcp","headers":{"Authorization":"Bearer {{secrets.TICKETS}}"}}}}`))
	require.NoError(t, err)
	b.Worker(t, "w1", paltest.MCP(cfg), paltest.Secrets(map[string]string{"TICKETS": "s3cret"}),
		paltest.SecretHosts(map[string]string{"TICKETS": "mcp.example.com"}))
	runID := b.Start(t, mcpToolNode("search", `{"query":"x"}`, `,"retry":{"maxAttempts":3,"backoffMs":1,"retryableClasses":["any"]}`), `{}`)
	end := b.WaitEnd(t, runID)
	require.Equal(t, event.RunFailed, end.Kind)
	f := data[event.RunFailedData](t, end)
	require.Contains(t, f.Error, "MCP server tickets: secret TICKETS may not be sent to "+addr)
	require.NotContains(t, f.Error, "s3cret")
	require.Empty(t, readTickets(t, dir).Calls)
	require.Empty(t, find(b.Events(t, runID), event.StepRetrying, ""), "a refusal is not retried")
}
