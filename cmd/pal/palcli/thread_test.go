package palcli_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/runs"
)

// pal run start --thread runs a thread step on the thread; a second start
// continues it; pal thread get shows the turns (human and --json, the
// same as GET /v1/threads/{id}); pal run list --thread finds the runs;
// a bad thread id exits 2 naming the flag and writes nothing, an unknown
// thread exits 3.
func TestThreadCommands(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.project(t)
	wf := b.file(t, "chat.json", `{"name":"chat","nodes":[{"id":"start","type":"trigger"},
		{"id":"ask","type":"ai-step","data":{"provider":"openai","model":"m","prompt":"{{input.q}}","thread":true}}],
		"edges":[{"from":"start","to":"ask"}]}`)
	start := func(q string, extra ...string) string {
		t.Helper()
		r := b.pal(t, nil, append([]string{"run", "start", "--workflow", wf, "--input", `{"q":"` + q + `"}`}, extra...)...)
		require.Equal(t, 0, r.code, "%s", r)
		id := strings.TrimSpace(r.stdout)
		b.WaitEnd(t, id)
		return id
	}
	one := start("hello", "--thread", "chat-1")
	two := start("and again", "--thread", "chat-1")
	alone := start("no thread")

	r := b.pal(t, nil, "thread", "get", "chat-1", "--json")
	require.Equal(t, 0, r.code, "%s", r)
	v := decodeJSON[runs.ThreadView](t, r.stdout)
	require.Equal(t, "chat-1", v.Thread)
	require.Len(t, v.Turns, 4)
	require.Equal(t, []string{one, one, two, two}, []string{v.Turns[0].RunID, v.Turns[1].RunID, v.Turns[2].RunID, v.Turns[3].RunID})
	require.Equal(t, "echo: and again", v.Turns[3].Content)
	require.Equal(t, "ask", v.Turns[3].StepID)
	require.Empty(t, v.Holds)

	r = b.pal(t, nil, "thread", "get", "chat-1")
	require.Equal(t, 0, r.code, "%s", r)
	require.Contains(t, r.stdout, "thread chat-1: 4 turns")
	require.Contains(t, r.stdout, one)
	require.Contains(t, r.stdout, "echo: hello")

	r = b.pal(t, nil, "run", "get", two, "--json")
	require.Equal(t, 0, r.code, "%s", r)
	require.Equal(t, "chat-1", decodeJSON[runs.RunView](t, r.stdout).Thread)

	p.caughtUp(t)
	db := p.db
	r = b.pal(t, db, "run", "list", "--json", "--thread", "chat-1")
	require.Equal(t, 0, r.code, "%s", r)
	l := decodeJSON[runs.RunList](t, r.stdout)
	require.Equal(t, []string{two, one}, runIDs(l))
	require.Equal(t, "chat-1", l.Runs[0].Thread)
	r = b.pal(t, db, "run", "list", "--json")
	require.Equal(t, 0, r.code, "%s", r)
	require.Contains(t, runIDs(decodeJSON[runs.RunList](t, r.stdout)), alone)

	before := b.journal(t)
	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"run", "start", "--workflow", wf, "--thread", "a.b"}, 2, "--thread: invalid thread id \"a.b\""},
		{[]string{"run", "start", "--workflow", wf, "--thread", strings.Repeat("t", 129)}, 2, "longer than 128 characters"},
		{[]string{"run", "list", "--thread", "a*"}, 2, "--thread"},
		{[]string{"thread", "get", "a>b"}, 2, "invalid thread id"},
		{[]string{"thread", "get", "never-used"}, 3, "thread not found"},
	} {
		r := b.pal(t, db, tc.args...)
		require.Equal(t, tc.code, r.code, "%v\n%s", tc.args, r)
		require.Contains(t, r.stderr, tc.msg, "%v", tc.args)
	}
	require.Equal(t, before, b.journal(t), "refused starts wrote nothing")
}
