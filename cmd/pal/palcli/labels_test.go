package palcli_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/runs"
)

// pal run start --label journals labels; pal run list filters by them and
// by the other filters of GET /v1/runs, and repeats them for the next
// page; bad labels and filters exit 2 naming the flag, writing nothing.
func TestRunLabels(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.project(t)
	wf := b.file(t, "wf.json", seqWorkflow(1))
	since := time.Now().UTC().Add(-time.Minute).Format(time.RFC3339)

	start := func(text string, labels ...string) string {
		t.Helper()
		args := []string{"run", "start", "--workflow", wf, "--input", fmt.Sprintf(`{"text":%q}`, text)}
		for _, l := range labels {
			args = append(args, "--label", l)
		}
		r := b.pal(t, nil, args...)
		require.Equal(t, 0, r.code, "%s", r)
		id := strings.TrimSpace(r.stdout)
		b.WaitEnd(t, id)
		return id
	}
	prod := start("one", "customer=acme", "env=prod")
	failed := start("FAIL two", "customer=acme", "note=a b=c")
	globex := start("three", "customer=globex")
	p.caughtUp(t)
	db := p.db

	list := func(args ...string) runs.RunList {
		t.Helper()
		r := b.pal(t, db, append([]string{"run", "list", "--json"}, args...)...)
		require.Equal(t, 0, r.code, "%s", r)
		return decodeJSON[runs.RunList](t, r.stdout)
	}
	require.Equal(t, []string{failed, prod}, runIDs(list("--label", "customer=acme")))
	require.Equal(t, []string{prod}, runIDs(list("--label", "customer=acme", "--label", "env=prod")))
	require.Equal(t, []string{failed}, runIDs(list("--label", "note=a b=c")), "a value may hold spaces and '='")
	l := list("--label", "customer=globex")
	require.Equal(t, []string{globex}, runIDs(l))
	require.Equal(t, map[string]string{"customer": "globex"}, l.Runs[0].Labels)

	l = list("--status", "failed", "--error-code", "step_failed", "--since", since, "--label", "customer=acme")
	require.Equal(t, []string{failed}, runIDs(l))
	word := strings.Fields(l.Runs[0].Error)[0]
	require.Equal(t, []string{failed}, runIDs(list("--search", strings.ToUpper(word), "--label", "customer=acme")))
	require.Empty(t, list("--until", since).Runs)

	r := b.pal(t, db, "run", "list", "--label", "customer=acme", "--limit", "1")
	require.Equal(t, 0, r.code, "%s", r)
	require.Contains(t, r.stderr, " --label 'customer=acme' --limit 1", "the next page keeps the filters")

	r = b.pal(t, nil, "run", "get", prod, "--json")
	require.Equal(t, 0, r.code, "%s", r)
	require.Equal(t, map[string]string{"customer": "acme", "env": "prod"}, decodeJSON[runs.RunView](t, r.stdout).Labels)

	before := b.journal(t)
	var many []string
	for i := range 17 {
		many = append(many, "--label", fmt.Sprintf("k%d=v", i))
	}
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"run", "start", "--workflow", wf, "--label", "Customer=acme"}, `label key "Customer"`},
		{[]string{"run", "start", "--workflow", wf, "--label", "customer"}, "want KEY=VALUE"},
		{[]string{"run", "start", "--workflow", wf, "--label", "k=a", "--label", "k=b"}, "given twice"},
		{[]string{"run", "start", "--workflow", wf, "--label", "k=" + strings.Repeat("v", 257)}, "the limit is 256"},
		{append([]string{"run", "start", "--workflow", wf}, many...), "17 labels; the limit is 16"},
		{[]string{"run", "list", "--label", "customer"}, "--label"},
		{[]string{"run", "list", "--since", "yesterday"}, "--since"},
		{[]string{"run", "list", "--until", "2026-13-01T00:00:00Z"}, "--until"},
		{[]string{"run", "list", "--error-code", "Step Failed"}, "--error-code"},
		{[]string{"run", "list", "--search", strings.Repeat("x", runs.MaxSearchBytes+1)}, "--search"},
		{[]string{"run", "list", "--before", "nonsense"}, "--before"},
	} {
		r := b.pal(t, db, tc.args...)
		require.Equal(t, 2, r.code, "%v\n%s", tc.args, r)
		require.Contains(t, r.stderr, tc.msg, "%v", tc.args)
	}
	require.Equal(t, before, b.journal(t), "refused starts wrote nothing")
}
