package palcli_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/runs"
)

// pal schedule create, list, get, pause, resume, trigger and delete
// against real NATS; a triggered run carries the schedule and its tick,
// and pal run list --schedule finds it. Bad flags exit 2 naming the
// flag, an unknown workflow 3, and nothing is stored.
func TestScheduleCommands(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.project(t)
	wf := b.file(t, "wf.json", seqWorkflow(1))
	r := b.pal(t, nil, "workflow", "deploy", wf)
	require.Equal(t, 0, r.code, "%s", r)
	name := strings.Split(strings.TrimSpace(r.stdout), "@")[0]

	huge := `{"x":"` + strings.Repeat("a", 70<<10) + `"}`
	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"--cron", "61 * * * *", "--workflow", name}, 2, "--cron"},
		{[]string{"--cron", "0 3 * * *", "--tz", "Mars/Olympus", "--workflow", name}, 2, "--tz"},
		{[]string{"--every", "2x", "--workflow", name}, 2, "--every"},
		{[]string{"--every", "500ms", "--workflow", name}, 2, "--every"},
		{[]string{"--every", "2s", "--cron", "@daily", "--workflow", name}, 2, "--every"},
		{[]string{"--workflow", name}, 2, "--cron"},
		{[]string{"--every", "2s", "--workflow", name, "--overlap", "queue"}, 2, "--overlap"},
		{[]string{"--every", "2s", "--workflow", name, "--catchup", "some"}, 2, "--catchup"},
		{[]string{"--every", "2s", "--workflow", name, "--input", huge}, 2, "--input"},
		{[]string{"--every", "2s", "--workflow", name, "--input", "{"}, 2, "--input"},
		{[]string{"--every", "2s"}, 2, "--workflow"},
		{[]string{"--every", "2s", "--workflow", "nope"}, 3, "not deployed"},
	} {
		r := b.pal(t, nil, append([]string{"schedule", "create", "bad"}, tc.args...)...)
		require.Equal(t, tc.code, r.code, "%v\n%s", tc.args, r)
		require.Contains(t, r.stderr, tc.msg, "%v", tc.args)
	}
	r = b.pal(t, nil, "schedule", "create", "bad.name", "--every", "2s", "--workflow", name)
	require.Equal(t, 2, r.code, "%s", r)
	require.Contains(t, r.stderr, "--name")
	r = b.pal(t, nil, "schedule", "list", "--json")
	require.Equal(t, 0, r.code, "%s", r)
	require.Empty(t, decodeJSON[runs.ScheduleList](t, r.stdout).Schedules, "nothing refused was stored")

	r = b.pal(t, nil, "schedule", "create", "nightly", "--cron", "0 3 * * *", "--tz", "Europe/Berlin", "--workflow", name,
		"--input", `{"text":"night"}`, "--json")
	require.Equal(t, 0, r.code, "%s", r)
	v := decodeJSON[runs.ScheduleView](t, r.stdout)
	require.Equal(t, "0 3 * * *", v.Cron)
	require.Equal(t, runs.OverlapSkip, v.Overlap)
	require.Equal(t, runs.CatchupOne, v.Catchup)
	berlin, err := time.LoadLocation("Europe/Berlin")
	require.NoError(t, err)
	next := v.Next.In(berlin)
	require.Equal(t, []int{3, 0, 0}, []int{next.Hour(), next.Minute(), next.Second()}, "03:00 in Berlin: %s", next)
	r = b.pal(t, nil, "schedule", "create", "nightly", "--every", "1h", "--workflow", name)
	require.Equal(t, 2, r.code, "a taken name: %s", r)

	r = b.pal(t, nil, "schedule", "pause", "nightly", "--json")
	require.Equal(t, 0, r.code, "%s", r)
	require.True(t, decodeJSON[runs.ScheduleView](t, r.stdout).Paused)
	r = b.pal(t, nil, "schedule", "list")
	require.Equal(t, 0, r.code, "%s", r)
	require.Contains(t, r.stdout, "paused")
	r = b.pal(t, nil, "schedule", "resume", "nightly")
	require.Equal(t, 0, r.code, "%s", r)
	r = b.pal(t, nil, "schedule", "get", "nightly")
	require.Equal(t, 0, r.code, "%s", r)
	require.False(t, decodeJSON[runs.ScheduleView](t, r.stdout).Paused)

	r = b.pal(t, nil, "schedule", "trigger", "nightly", "--json")
	require.Equal(t, 0, r.code, "%s", r)
	res := decodeJSON[runs.TriggerResult](t, r.stdout)
	require.Equal(t, event.ScheduleRunID("nightly", res.Tick), res.RunID)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, res.RunID).Kind)
	p.caughtUp(t)
	r = b.pal(t, p.db, "run", "list", "--schedule", "nightly", "--json")
	require.Equal(t, 0, r.code, "%s", r)
	l := decodeJSON[runs.RunList](t, r.stdout)
	require.Equal(t, []string{res.RunID}, runIDs(l))
	require.Equal(t, "nightly", l.Runs[0].Schedule)
	require.Equal(t, runs.FormatTime(res.Tick), l.Runs[0].Tick)
	r = b.pal(t, p.db, "run", "list", "--schedule", "a.b")
	require.Equal(t, 2, r.code, "%s", r)
	require.Contains(t, r.stderr, "--schedule")

	r = b.pal(t, nil, "schedule", "delete", "nightly")
	require.Equal(t, 0, r.code, "%s", r)
	r = b.pal(t, nil, "schedule", "get", "nightly")
	require.Equal(t, 3, r.code, "%s", r)
}
