package palcli_test

import (
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/paltest/testenv"
)

// A bad PAL_EGRESS_ALLOW stops pal worker at start, naming the variable,
// before it connects to anything.
func TestWorkerRefusesBadEgressAllow(t *testing.T) {
	t.Parallel()
	bin := testenv.PalBinary(t)
	for _, cmd := range []string{"worker", "dev"} {
		r := runPal(t, bin, []string{"PAL_NATS_URL=nats://127.0.0.1:1", "PAL_EGRESS_ALLOW=127.0.0.1/32,10.0.0.0/33", "PAL_DATA_DIR=" + t.TempDir()}, cmd)
		require.Equal(t, 2, r.code, "%s", r)
		require.Contains(t, r.stderr, `PAL_EGRESS_ALLOW: "10.0.0.0/33" is not a CIDR`, cmd)
	}
}

// A bad setting names where it came from: the flag when the value came
// from the flag, the variable when it came from the environment.
func TestWorkerSettingErrorsNameTheirSource(t *testing.T) {
	t.Parallel()
	bin := testenv.PalBinary(t)
	badMCP := filepath.Join(t.TempDir(), "mcp.json")
	require.NoError(t, os.WriteFile(badMCP, []byte(`{"mcpServers":{"gh":{"url":"ftp://x"}}}`), 0o600))
	cases := []struct {
		env  []string
		args []string
		msg  string
	}{
		{nil, []string{"--durability", "foo"}, `--durability "foo": want "process" or "strict"`},
		{[]string{"PAL_DURABILITY=foo"}, nil, `PAL_DURABILITY="foo": want "process" or "strict"`},
		{[]string{"PAL_DURABILITY=strict"}, []string{"--durability", "foo"}, `--durability "foo": want`},
		{nil, []string{"--lease-ttl", "1500ms"}, `--lease-ttl "1500ms": leases expire in whole seconds`},
		{[]string{"PAL_LEASE_TTL=1500ms"}, nil, `PAL_LEASE_TTL="1500ms": leases expire in whole seconds`},
		{nil, []string{"--lease-ttl", "soon"}, `--lease-ttl "soon": not a duration`},
		{[]string{"PAL_LEASE_TTL=500ms"}, nil, `PAL_LEASE_TTL="500ms": must be at least 1s`},
		{nil, []string{"--worker-id", "a.b"}, `--worker-id "a.b": use letters, digits`},
		{[]string{"PAL_WORKER_ID=a.b"}, nil, `PAL_WORKER_ID="a.b": use letters, digits`},
		{nil, []string{"--concurrency", "0"}, `--concurrency "0": want a whole number ≥ 1`},
		{[]string{"PAL_RUN_CONCURRENCY=0"}, nil, `PAL_RUN_CONCURRENCY="0": want a whole number ≥ 1`},
		{[]string{"PAL_RUN_CONCURRENCY=-4"}, nil, `PAL_RUN_CONCURRENCY="-4": want a whole number ≥ 1`},
		{[]string{"PAL_RUN_CONCURRENCY=eight"}, nil, `PAL_RUN_CONCURRENCY="eight": want a whole number ≥ 1`},
		{[]string{"PAL_RUN_CONCURRENCY=99999999999999999999"}, nil, `PAL_RUN_CONCURRENCY="99999999999999999999": want a whole number ≥ 1`},
		{[]string{"PAL_RUN_CONCURRENCY=1001"}, nil, `PAL_RUN_CONCURRENCY="1001": at most 1000`},
		{nil, []string{"--run-concurrency", "5000"}, `--run-concurrency "5000": at most 1000`},
		{[]string{"PAL_THREAD_MAX_TURNS=0"}, nil, `PAL_THREAD_MAX_TURNS="0": want a whole number ≥ 1`},
		{[]string{"PAL_THREAD_MAX_BYTES=8MiB"}, nil, `PAL_THREAD_MAX_BYTES="8MiB": want a whole number ≥ 1`},
		{[]string{"PAL_PROCESS_SANDBOX=maybe"}, nil, `PAL_PROCESS_SANDBOX="maybe": want on or off`},
		{[]string{"PAL_PROCESS_MOUNTS=opt/agent"}, nil, `PAL_PROCESS_MOUNTS: "opt/agent": want an absolute HOST path`},
		{[]string{"PAL_PROCESS_MOUNTS=/no/such/dir"}, nil, `mount /no/such/dir: stat /no/such/dir: no such file or directory`},
		{[]string{"PAL_PROCESS_PROGRAMS=python3,no-such-program"}, nil, `the program "no-such-program" is not on the sandbox's PATH`},
		{[]string{"PAL_MCP_CONFIG=/no/such/mcp.json"}, nil, `PAL_MCP_CONFIG: open /no/such/mcp.json: no such file or directory`},
		{[]string{"PAL_MCP_CONFIG=" + badMCP}, nil, `PAL_MCP_CONFIG=` + badMCP + `: mcpServers.gh: url: "ftp://x": want an http:// or https:// URL`},
	}
	// The cases are processes that exit at once: four at a time.
	results := make([]result, len(cases))
	errs := make([]error, len(cases))
	sem := make(chan struct{}, 4)
	var wg sync.WaitGroup
	for i, tc := range cases {
		env := append([]string{"PAL_NATS_URL=nats://127.0.0.1:1", "PAL_DATA_DIR=" + t.TempDir()}, tc.env...)
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			results[i], errs[i] = execPal(bin, "", env, append([]string{"worker"}, tc.args...)...)
		})
	}
	wg.Wait()
	for i, tc := range cases {
		require.NoError(t, errs[i])
		require.Equal(t, 2, results[i].code, "%v %v\n%s", tc.env, tc.args, results[i])
		require.Contains(t, results[i].stderr, tc.msg, "%v %v", tc.env, tc.args)
	}
}
