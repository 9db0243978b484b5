package runs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/runs"
)

const tickFlow = `{"name":"tick-flow","nodes":[{"id":"start","type":"trigger"},{"id":"e","type":"tool","data":{"tool":"echo"}}],"edges":[{"from":"start","to":"e"}]}`

// TestSchedulerCatchup: a schedule every 2 s whose scheduler wakes 10
// minutes late (300 ticks missed, the clock injected) fires what its
// catchup says: all the latest runs.MaxCatchup ticks, one the latest
// tick, none nothing; each moves the schedule's last tick past them all.
// A second scheduler at the same time fires nothing more.
func TestSchedulerCatchup(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.Deploy(t, tickFlow)
	ctx := context.Background()
	for _, tc := range []struct {
		catchup string
		runs    int
	}{{runs.CatchupAll, runs.MaxCatchup}, {runs.CatchupOne, 1}, {runs.CatchupNone, 0}} {
		t.Run(tc.catchup, func(t *testing.T) {
			name := "late-" + tc.catchup
			v, err := b.Runs.CreateSchedule(ctx, runs.ScheduleCommand{Name: name, Every: "2s", Workflow: "tick-flow",
				Catchup: tc.catchup, Overlap: runs.OverlapAllow, Rights: runs.AllRights})
			require.NoError(t, err)
			last := v.Created.Add(300 * 2 * time.Second)
			now := last.Add(1500 * time.Millisecond) // past none's grace (half the interval)
			for range 2 {
				s := runs.NewScheduler(b.Runs, runs.WithSchedulerClock(func() time.Time { return now }))
				require.NoError(t, s.Start(ctx))
				require.Eventually(t, func() bool {
					got, err := b.Runs.GetSchedule(ctx, name)
					return err == nil && got.LastTick.Equal(last)
				}, 30*time.Second, 20*time.Millisecond)
				require.NoError(t, s.Stop(ctx))
			}
			n := 0
			for k := 1; k <= 300; k++ {
				tick := v.Created.Add(time.Duration(k) * 2 * time.Second)
				_, h, err := b.Store.LastEvent(ctx, event.ScheduleRunID(name, tick))
				require.NoError(t, err)
				if h.Seq == 0 {
					continue
				}
				n++
				require.Greater(t, k, 300-tc.runs, "tick %d of 300 fired; only the latest %d are", k, tc.runs)
			}
			require.Equal(t, tc.runs, n)
		})
	}
}

// TestScheduleClock: cron ticks in a time zone (across a change to
// summer time), descriptors, and the bounds of every.
func TestScheduleClock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.Deploy(t, tickFlow)
	ctx := context.Background()
	v, err := b.Runs.CreateSchedule(ctx, runs.ScheduleCommand{Name: "berlin", Cron: "30 2 * * *", TZ: "Europe/Berlin",
		Workflow: "tick-flow", Rights: runs.AllRights})
	require.NoError(t, err)
	berlin, err := time.LoadLocation("Europe/Berlin")
	require.NoError(t, err)
	n := v.Next.In(berlin)
	require.Equal(t, fmt.Sprintf("%02d:%02d", 2, 30), n.Format("15:04"))
	for _, tc := range []struct {
		cmd   runs.ScheduleCommand
		field string
	}{
		{runs.ScheduleCommand{Name: "x", Every: "@every 1s", Workflow: "tick-flow"}, "every"},
		{runs.ScheduleCommand{Name: "x", Cron: "@every 1s", Workflow: "tick-flow"}, "cron"},
		{runs.ScheduleCommand{Name: "x", Cron: "CRON_TZ=UTC 0 3 * * *", Workflow: "tick-flow"}, "cron"},
		{runs.ScheduleCommand{Name: "x", Cron: "0 0 3 * * *", Workflow: "tick-flow"}, "cron"},
		{runs.ScheduleCommand{Name: "x", Cron: "0 3 * * *", TZ: "Local", Workflow: "tick-flow"}, "tz"},
		{runs.ScheduleCommand{Name: "x", Every: "2s", TZ: "UTC", Workflow: "tick-flow"}, "tz"},
		{runs.ScheduleCommand{Name: "x", Every: "367d", Workflow: "tick-flow"}, "every"},
		{runs.ScheduleCommand{Name: "x", Every: "9000h", Workflow: "tick-flow"}, "every"},
		{runs.ScheduleCommand{Name: "x", Every: "2s", Workflow: "tick-flow", Input: json.RawMessage(`{`)}, "input"},
		{runs.ScheduleCommand{Name: "x", Every: "2s", Workflow: "tick-flow@x"}, "workflow"},
	} {
		tc.cmd.Rights = runs.AllRights
		_, err := b.Runs.CreateSchedule(ctx, tc.cmd)
		var ie *runs.InputError
		require.ErrorAs(t, err, &ie, "%+v", tc.cmd)
		require.Equal(t, tc.field, ie.Field, "%+v: %v", tc.cmd, err)
	}
	_, err = b.Runs.CreateSchedule(ctx, runs.ScheduleCommand{Name: "y", Every: "2s", Workflow: "tick-flow", Rights: runs.RightStart})
	var fe *runs.ForbiddenError
	require.ErrorAs(t, err, &fe, "creating a schedule needs the right to deploy")
	_, err = b.Runs.TriggerSchedule(ctx, runs.ScheduleNameCommand{Name: "berlin", Rights: runs.RightDeploy})
	require.ErrorAs(t, err, &fe, "triggering needs the right to start")
}
