package workers_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/workers"
)

// TestParseMCPConfigRefusesBadFiles: every malformed PAL_MCP_CONFIG is
// refused with an error naming the server and the field; the size and
// count bounds hold.
func TestParseMCPConfigRefusesBadFiles(t *testing.T) {
	t.Parallel()
	many := map[string]any{}
	for i := range workers.MaxMCPServers + 1 {
		many["s"+strings.Repeat("x", i%3)+string(rune('a'+i%26))+string(rune('a'+i/26))] = map[string]any{"command": "/bin/true"}
	}
	manyDoc, err := json.Marshal(map[string]any{"mcpServers": many})
	require.NoError(t, err)
	for _, tc := range []struct{ name, doc, want string }{
		{"not JSON", `{`, "not a JSON object"},
		{"unknown top field", `{"servers":{}}`, `unknown field "servers"`},
		{"two values", `{"mcpServers":{}} {}`, "more than one JSON value"},
		{"neither", `{"mcpServers":{"gh":{}}}`, "mcpServers.gh: set command (a stdio server) or url"},
		{"both", `{"mcpServers":{"gh":{"command":"x","url":"https://a"}}}`, "mcpServers.gh: set command or url, not both"},
		{"bad name", `{"mcpServers":{"g h":{"command":"x"}}}`, "mcpServers.g h: the name must be"},
		{"unknown field", `{"mcpServers":{"gh":{"command":"x","cwd":"/"}}}`, `mcpServers.gh: json: unknown field "cwd"`},
		{"bad type", `{"mcpServers":{"gh":{"type":"sse","url":"https://a"}}}`, `mcpServers.gh: type: "sse"`},
		{"headers on stdio", `{"mcpServers":{"gh":{"command":"x","headers":{"A":"b"}}}}`, "mcpServers.gh: headers: a stdio server"},
		{"env on http", `{"mcpServers":{"gh":{"url":"https://a","env":{"A":"b"}}}}`, "mcpServers.gh: args, env and network are a stdio server's"},
		{"bad url", `{"mcpServers":{"gh":{"url":"ftp://a"}}}`, `mcpServers.gh: url: "ftp://a": want an http:// or https:// URL`},
		{"userinfo", `{"mcpServers":{"gh":{"url":"https://u:p@a"}}}`, "mcpServers.gh: url: no user or password"},
		{"secret in url", `{"mcpServers":{"gh":{"url":"https://a/{{secrets.T}}"}}}`, "mcpServers.gh: url: secrets ({{secrets.NAME}}) go in env or headers values only"},
		{"secret in args", `{"mcpServers":{"gh":{"command":"x","args":["{{secrets.T}}"]}}}`, "mcpServers.gh: args[0]: secrets"},
		{"bad env name", `{"mcpServers":{"gh":{"command":"x","env":{"A-B":"1"}}}}`, `mcpServers.gh: env: "A-B" is not a valid name`},
		{"bad header name", `{"mcpServers":{"gh":{"url":"https://a","headers":{"A B":"1"}}}}`, `mcpServers.gh: headers: "A B" is not a valid name`},
		{"bad network", `{"mcpServers":{"gh":{"command":"x","network":"host"}}}`, `mcpServers.gh: network: "host": want none or egress`},
		{"too many", string(manyDoc), "at most 64"},
		{"too big", `{"mcpServers":{"gh":{"command":"` + strings.Repeat("x", workers.MaxMCPConfigBytes) + `"}}}`, "the file is over 256 KiB"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := workers.ParseMCPConfig([]byte(tc.doc))
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.want)
		})
	}
	cfg, err := workers.ParseMCPConfig([]byte(`{"mcpServers":{"gh":{"type":"http","url":"https://mcp.example.com/mcp","headers":{"Authorization":"Bearer {{secrets.GH}}"}},
		"tickets":{"command":"tickets","args":["-dir","/data"],"env":{"TOKEN":"{{ secrets.T }}"},"network":"egress"}}}`))
	require.NoError(t, err)
	require.Equal(t, []string{"gh", "tickets"}, cfg.Names())

	_, err = workers.LoadMCPConfig(filepath.Join(t.TempDir(), "missing.json"))
	require.ErrorContains(t, err, "PAL_MCP_CONFIG: open")
	big := filepath.Join(t.TempDir(), "big.json")
	require.NoError(t, os.WriteFile(big, []byte(strings.Repeat(" ", workers.MaxMCPConfigBytes+1)), 0o600))
	_, err = workers.LoadMCPConfig(big)
	require.ErrorContains(t, err, "PAL_MCP_CONFIG="+big+": the file is over 256 KiB")
}

// TestMCPServerFailuresAreRetryable: a server that does not start, one
// that crashes in the call and one that does not answer in time fail
// the call with a retryable error naming the server (class tool, or
// timeout), each attempt journaled; the worker goes on and drives the
// next run.
func TestMCPServerFailuresAreRetryable(t *testing.T) {
	t.Parallel()
	bin := ticketsBinary(t)
	dir := sharedDir(t)
	hold := filepath.Join(dir, "hold")
	require.NoError(t, os.WriteFile(hold, nil, 0o644))
	servers := map[string]any{
		"nostart": map[string]any{"command": "/bin/false"},
		"crashes": map[string]any{"command": bin, "args": []string{"-dir", dir, "-crash"}},
		"slow":    map[string]any{"command": bin, "args": []string{"-dir", dir, "-hold", hold}},
		"tickets": map[string]any{"command": bin, "args": []string{"-dir", dir}},
	}
	cfg, err := workers.LoadMCPConfig(mcpConfigFile(t, servers))
	require.NoError(t, err)
	b := setup(t)
	w := b.Worker(t, "w1", paltest.MCP(cfg), paltest.Sandbox(runner(t, dir+":rw")))
	for _, tc := range []struct {
		server, class, want string
		timeoutMs           int
	}{
		{"nostart", event.ClassTool, "MCP server nostart: exited", 30000},
		{"crashes", event.ClassTool, "MCP server crashes: tool create_ticket: the connection ended during the call", 30000},
		{"slow", event.ClassTimeout, "MCP: no answer within the step's timeout", 1500},
	} {
		t.Run(tc.server, func(t *testing.T) {
			wf := strings.Replace(mcpToolNode("create_ticket", `{"title":"x"}`, `,"timeoutMs":`+strconv.Itoa(tc.timeoutMs)+`,"retry":{"maxAttempts":2,"backoffMs":1,"retryableClasses":["tool","timeout"]}`),
				`"mcp":"tickets"`, `"mcp":"`+tc.server+`"`, 1)
			runID := b.Start(t, wf, `{}`)
			end := b.WaitEnd(t, runID)
			require.Equal(t, event.RunFailed, end.Kind)
			var retrying []event.StepRetryingData
			for _, ev := range b.Events(t, runID) {
				if ev.Kind == event.StepRetrying {
					retrying = append(retrying, data[event.StepRetryingData](t, ev))
				}
			}
			require.Len(t, retrying, 1, "the first attempt is retried: %s", end.Data)
			require.Equal(t, tc.class, retrying[0].Class)
			require.Contains(t, retrying[0].Error, tc.want)
			require.Contains(t, data[event.RunFailedData](t, end).Error, tc.want)
		})
	}
	// The worker is unharmed, and a sound server answers.
	runID := b.Start(t, mcpToolNode("create_ticket", `{"title":"{{input.title}}"}`, ""), `{"title":"after the failures"}`)
	end := b.WaitEnd(t, runID)
	require.Equal(t, event.RunSucceeded, end.Kind, "%s", end.Data)
	var out struct {
		StructuredContent struct {
			ID    int    `json:"id"`
			Title string `json:"title"`
			Key   string `json:"key"`
		} `json:"structuredContent"`
	}
	require.NoError(t, json.Unmarshal(data[event.RunSucceededData](t, end).Output, &out))
	require.Equal(t, "after the failures", out.StructuredContent.Title)
	require.Equal(t, key(runID, "call", 1), out.StructuredContent.Key)
	require.Equal(t, "w1", w.ID())

	// An unknown server and a run that names it fail at once, naming the
	// configured ones.
	runID = b.Start(t, strings.Replace(mcpToolNode("x", `{}`, ""), `"mcp":"tickets"`, `"mcp":"nope"`, 1), `{}`)
	f := data[event.RunFailedData](t, b.WaitEnd(t, runID))
	require.Contains(t, f.Error, `MCP server "nope" is not in worker w1's PAL_MCP_CONFIG (configured: crashes, nostart, slow, tickets)`)
}
