package palcli_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/runs"
)

// notify is a deployable workflow whose one step echoes which version of
// it ran.
func notify(version int) string {
	return fmt.Sprintf(`{"name":"notify","nodes":[{"id":"start","type":"trigger"},
		{"id":"t1","type":"tool","data":{"tool":"echo","input":{"version":%d}}}],"edges":[{"from":"start","to":"t1"}]}`, version)
}

// pal workflow deploy prints NAME@VERSION (the next version for new
// content, the latest for the same); pal run start NAME[@VERSION] starts
// a deployed version, whose run keeps it; pal workflow list and get read
// the registry.
func TestWorkflowDeployAndStartByName(t *testing.T) {
	t.Parallel()
	b := setup(t)
	v1, v2 := b.file(t, "v1.json", notify(1)), b.file(t, "v2.json", notify(2))

	r := b.pal(t, nil, "workflow", "deploy", v1)
	require.Equal(t, 0, r.code, "%s", r)
	require.Equal(t, "notify@1\n", r.stdout)
	require.Contains(t, r.stderr, "deployed notify@1")
	r = b.pal(t, nil, "workflow", "deploy", v1, "--json")
	require.Equal(t, 0, r.code, "%s", r)
	out := decodeJSON[map[string]any](t, r.stdout)
	require.Equal(t, "notify", out["name"])
	require.Equal(t, float64(1), out["version"], "unchanged content keeps its version")
	require.Len(t, out["sha256"], 64)
	r = b.pal(t, nil, "workflow", "deploy", v1)
	require.Contains(t, r.stderr, "notify@1 is unchanged")
	r = b.pal(t, nil, "workflow", "deploy", v2)
	require.Equal(t, "notify@2\n", r.stdout, "%s", r)

	versionOf := func(args ...string) uint64 {
		t.Helper()
		r := b.pal(t, nil, append([]string{"run", "start"}, args...)...)
		require.Equal(t, 0, r.code, "%s", r)
		id := strings.TrimSpace(r.stdout)
		var d event.RunCreatedData
		require.NoError(t, b.Events(t, id)[0].DecodeData(&d))
		require.Equal(t, "notify", d.Deployed.Name)
		end := b.WaitEnd(t, id)
		var ok event.RunSucceededData
		require.NoError(t, end.DecodeData(&ok))
		require.JSONEq(t, fmt.Sprintf(`{"version":%d}`, d.Deployed.Version), string(ok.Output), "the run ran the version it names")
		return d.Deployed.Version
	}
	require.Equal(t, uint64(1), versionOf("notify@1", "--wait"))
	require.Equal(t, uint64(2), versionOf("notify", "--input", `{"x":1}`))
	// --workflow FILE deploys the file, then starts it.
	require.Equal(t, uint64(3), versionOf("--workflow", b.file(t, "v3.json", notify(3))))

	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"run", "start", "nobody"}, 3, "workflow nobody: workflow not deployed"},
		{[]string{"run", "start", "notify@9"}, 3, "the latest version is 3"},
		{[]string{"run", "start", "no.dots"}, 2, "invalid workflow name"},
		{[]string{"run", "start", "notify@0"}, 2, "want a whole number from 1"},
		{[]string{"run", "start", "notify", "--workflow", v1}, 2, "not both"},
		{[]string{"run", "start"}, 2, "pal run start NAME[@VERSION]"},
		{[]string{"workflow", "get", "notify@9"}, 3, "not deployed"},
		{[]string{"workflow", "deploy", b.file(t, "bad.json", `{"name":"bad name","nodes":[{"id":"start","type":"trigger"}]}`)}, 2, "invalid workflow name"},
	} {
		r := b.pal(t, nil, tc.args...)
		require.Equal(t, tc.code, r.code, "%s", r)
		require.Contains(t, r.stderr, tc.want, "%v", tc.args)
	}

	r = b.pal(t, nil, "workflow", "list")
	require.Equal(t, 0, r.code, "%s", r)
	require.Regexp(t, `(?m)^NAME\s+VERSION\s+SHA256\s+DEPLOYED\s+BY$`, r.stdout)
	require.Regexp(t, `(?m)^notify\s+3\s+[0-9a-f]{12}\s+\S+\s+pal-cli$`, r.stdout)
	r = b.pal(t, nil, "workflow", "list", "--json")
	list := decodeJSON[runs.WorkflowList](t, r.stdout)
	require.Len(t, list.Workflows, 1)
	require.Equal(t, uint64(3), list.Workflows[0].Version)

	r = b.pal(t, nil, "workflow", "get", "notify@1")
	require.Equal(t, 0, r.code, "%s", r)
	require.JSONEq(t, notify(1), r.stdout)
	require.Contains(t, r.stderr, "notify@1 sha256 ")
	require.Contains(t, r.stderr, "versions: 3 (")
	r = b.pal(t, nil, "workflow", "get", "notify", "--json")
	view := decodeJSON[runs.WorkflowView](t, r.stdout)
	require.Equal(t, uint64(3), view.Version)
	require.Len(t, view.Versions, 3)
}
