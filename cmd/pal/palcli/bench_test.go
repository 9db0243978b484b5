package palcli_test

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/paltest/testenv"
)

// TestBenchEconomics runs `pal bench --economics`: real worker processes,
// killed with SIGKILL at steps 5, 10 and 15 of a 20-step LLM run. PAL
// re-spends nothing with a provider that deduplicates keys (23 calls, 20
// charged), the three in-flight steps without one, and a restart from
// scratch re-runs 5+10+15 steps. gpt-4o is priced from the table; a
// PAL_PRICES file overrides it.
func TestBenchEconomics(t *testing.T) {
	t.Parallel()
	bin := testenv.PalBinary(t)
	start := time.Now()
	r := runPal(t, bin, nil, "bench", "--economics")
	require.Zero(t, r.code, r)
	require.Less(t, time.Since(start), 60*time.Second)
	row := func(name string) []string {
		m := regexp.MustCompile(regexp.QuoteMeta(name) + `\s+(\d+)\s+(\d+)\s+\$([0-9.]+)`).FindStringSubmatch(r.stdout)
		require.NotNil(t, m, "no row %q in\n%s", name, r.stdout)
		return m[1:]
	}
	// Step i costs (1000+500(i-1))·$2.50/M in + 300·$10/M out.
	require.Equal(t, []string{"50", "50", "0.3650"}, row("restart from scratch"))
	require.Equal(t, []string{"23", "23", "0.0503"}, row("PAL, provider ignores keys"))
	require.Equal(t, []string{"23", "20", "0.0000"}, row("PAL, provider dedups by key"))
	require.Contains(t, r.stdout, "one clean run costs $0.3475")
	require.Contains(t, r.stdout, "4 worker processes; the journal's cost_usd totals $0.3475")

	prices := filepath.Join(t.TempDir(), "prices.json")
	require.NoError(t, os.WriteFile(prices, []byte(`{"models":{"gpt-4o":{"input_per_mtok":1,"output_per_mtok":1}}}`), 0o600))
	r = runPal(t, bin, []string{"PAL_PRICES=" + prices}, "bench", "--economics")
	require.Zero(t, r.code, r)
	require.Contains(t, r.stdout, "($1.00 in / $1.00 out per MTok)")
	// (20·1000 + 500·190 + 20·300) tokens at $1/M, in the workers' journal too.
	require.Contains(t, r.stdout, "one clean run costs $0.1210")
	require.Contains(t, r.stdout, "the journal's cost_usd totals $0.1210")

	r = runPal(t, bin, nil, "bench", "--economics", "--model", "mystery")
	require.NotZero(t, r.code)
	require.Contains(t, r.stderr, "the price table does not know it")
}

// TestBenchCluster runs `pal bench --cluster`: beside the single-server
// row, a row measured on three pal dev-nats-node processes with R3
// streams, each with a per-step latency and a throughput above zero.
func TestBenchCluster(t *testing.T) {
	t.Parallel()
	bin := testenv.PalBinary(t)
	start := time.Now()
	r := runPal(t, bin, nil, "bench", "--cluster", "--durability", "process", "--steps", "20", "--runs", "4", "--steps-per-run", "5")
	require.Zero(t, r.code, r)
	require.Less(t, time.Since(start), 60*time.Second)
	for _, name := range []string{"process", "cluster R3"} {
		m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `\s+(\d+) µs\s+(\d+) µs\s+(\d+)\s+(\d+)\s+4 × 5$`).FindStringSubmatch(r.stdout)
		require.NotNil(t, m, "no row %q in\n%s", name, r.stdout)
		for _, v := range m[1:] {
			require.NotEqual(t, "0", v, "row %q: %s", name, m[0])
		}
	}
}

// TestBenchSustained keeps runs in flight for --duration: the row says so,
// and its throughput counts only runs that ended in the window.
func TestBenchSustained(t *testing.T) {
	t.Parallel()
	bin := testenv.PalBinary(t)
	r := runPal(t, bin, nil, "bench", "--durability", "strict", "--steps", "10", "--runs", "8", "--steps-per-run", "3", "--duration", "2s")
	require.Zero(t, r.code, r)
	m := regexp.MustCompile(`(?m)^strict\s+(\d+) µs\s+(\d+) µs\s+(\d+)\s+(\d+)\s+8 in flight × 3, 2s$`).FindStringSubmatch(r.stdout)
	require.NotNil(t, m, "no sustained row in\n%s", r.stdout)
	for _, v := range m[1:] {
		require.NotEqual(t, "0", v, m[0])
	}

	for _, bad := range []string{"-1s", "2h"} {
		r = runPal(t, bin, nil, "bench", "--duration="+bad)
		require.Equal(t, 2, r.code, r)
		require.Contains(t, r.stderr, "--duration="+bad)
	}
}

// pal bench --help says what --cluster starts (pal dev-nats-node
// processes, as benchCluster does), and a bad --durability names the flag.
func TestBenchHelpAndFlags(t *testing.T) {
	t.Parallel()
	bin := testenv.PalBinary(t)
	r := runPal(t, bin, nil, "bench", "--help")
	require.Zero(t, r.code, r)
	require.Regexp(t, `--cluster\s+also measure on a 3-node cluster \(three pal dev-nats-node processes on loopback, R3\)`, r.stdout)
	require.NotContains(t, r.stdout, "nats-server processes")
	r = runPal(t, bin, nil, "bench", "--durability", "fast")
	require.Equal(t, 2, r.code, r)
	require.Contains(t, r.stderr, `--durability "fast": want process, strict or both`)
}

// TestBenchFanOut runs `pal bench --fan-out`: beside the concurrent runs,
// one run fanning out to that many steps, with its throughput and the
// ratio to theirs; a fan-out out of bounds is refused.
func TestBenchFanOut(t *testing.T) {
	t.Parallel()
	bin := testenv.PalBinary(t)
	r := runPal(t, bin, nil, "bench", "--durability", "process", "--steps", "10", "--runs", "4", "--steps-per-run", "5",
		"--fan-out", "60", "--fan-out-concurrency", "8")
	require.Zero(t, r.code, r)
	m := regexp.MustCompile(`(?m)^process\s+60 steps, 8 at once\s+(\d+)\s+(\d+) \(4 × 5\)\s+(\d+)%$`).FindStringSubmatch(r.stdout)
	require.NotNil(t, m, "no fan-out row in\n%s", r.stdout)
	for _, v := range m[1:] {
		require.NotEqual(t, "0", v, m[0])
	}
	for _, args := range [][]string{{"--fan-out", "10001"}, {"--fan-out", "-1"}, {"--fan-out", "5", "--fan-out-concurrency", "0"},
		{"--fan-out", "5", "--fan-out-concurrency", "1001"}} {
		r := runPal(t, bin, nil, append([]string{"bench"}, args...)...)
		require.Equal(t, 2, r.code, "%v: %s", args, r)
		require.Contains(t, r.stderr, "--fan-out=", args)
	}
}
