package api_test

import (
	"context"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/runs"
)

// TestBrowserSchedules: the schedules page lists each schedule with its
// clock, workflow, state and next tick; Run now starts a run that the
// row then links to, Pause and Resume change its state, Delete removes
// it; a schedule's name links to its runs.
func TestBrowserSchedules(t *testing.T) {
	b := setup(t, withWorker())
	b.Deploy(t, echoFlow)
	ctx := context.Background()
	_, err := b.Runs.CreateSchedule(ctx, runs.ScheduleCommand{Name: "nightly", Cron: "0 3 * * *", TZ: "Europe/Berlin",
		Workflow: "echo-flow", Rights: runs.AllRights})
	require.NoError(t, err)
	_, err = b.Runs.CreateSchedule(ctx, runs.ScheduleCommand{Name: "often", Every: "1h", Workflow: "echo-flow",
		Overlap: runs.OverlapAllow, Catchup: runs.CatchupAll, Rights: runs.AllRights})
	require.NoError(t, err)

	br := newBrowser(t)
	br.loginAt(b, "/schedules", testToken)
	require.Equal(t, "/schedules", eval[string](br, `document.querySelector('#nav-schedules').getAttribute('href')`), "every page's bar links here")
	br.waitJS("the schedules", `document.querySelectorAll('#schedules tr.schedule').length === 2`)
	require.Equal(t, []string{"nightly", "often"}, eval[[]string](br, `[...document.querySelectorAll('#schedules tr.schedule')].map(r => r.dataset.name)`))
	require.Equal(t, []string{"0 3 * * * (Europe/Berlin)", "echo-flow", "active", "skip · one"},
		eval[[]string](br, `[...document.querySelectorAll('tr[data-name="nightly"] td')].filter((_, i) => [1, 2, 3, 6].includes(i)).map(td => td.textContent)`))
	require.Equal(t, "every 1h", eval[string](br, `document.querySelector('tr[data-name="often"] td:nth-child(2)').textContent`))
	require.NotEqual(t, "—", eval[string](br, `document.querySelector('tr[data-name="nightly"] .next').textContent`), "an active schedule shows its next tick")
	br.screenshot(t, "schedules")

	// Run now: the row links to the run it started, one of the schedule's.
	br.do(chromedp.Click(chromedp.CSS(`tr[data-name="nightly"] button.trigger`)))
	br.waitJS("the triggered run", `!!document.querySelector('tr[data-name="nightly"] .last a')`)
	runID := eval[string](br, `document.querySelector('tr[data-name="nightly"] .last a').textContent`)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, runID).Kind)
	var c event.RunCreatedData
	require.NoError(t, b.Events(t, runID)[0].DecodeData(&c))
	require.Equal(t, "nightly", c.Schedule)

	// Pause, then resume.
	br.do(chromedp.Click(chromedp.CSS(`tr[data-name="often"] button.pause`)))
	br.waitJS("paused", `document.querySelector('tr[data-name="often"]').dataset.state === "paused"`)
	require.Equal(t, "—", eval[string](br, `document.querySelector('tr[data-name="often"] .next').textContent`))
	v, err := b.Runs.GetSchedule(ctx, "often")
	require.NoError(t, err)
	require.True(t, v.Paused)
	br.do(chromedp.Click(chromedp.CSS(`tr[data-name="often"] button.resume`)))
	br.waitJS("resumed", `document.querySelector('tr[data-name="often"]').dataset.state === "active"`)

	// Delete (the confirmation answered yes).
	require.True(t, eval[bool](br, `(window.confirm = () => true, true)`))
	br.do(chromedp.Click(chromedp.CSS(`tr[data-name="often"] button.delete`)))
	br.waitJS("deleted", `!document.querySelector('tr[data-name="often"]')`)
	_, err = b.Runs.GetSchedule(ctx, "often")
	require.ErrorIs(t, err, runs.ErrScheduleNotFound)

	// The name links to the schedule's runs.
	br.do(chromedp.Click(chromedp.CSS(`tr[data-name="nightly"] td a`)))
	br.waitJS("the runs list", `location.pathname === "/" && location.search === "?schedule=nightly"`)
}
