package api_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/workers"
)

// TestBrowserLanes: a run whose four branches ran at once, then a join.
// The lane view draws one row per lane, four of them, with the branches'
// bars overlapping, one to a lane, and the join after them in a lane a
// branch had; a click on a bar shows its step.
func TestBrowserLanes(t *testing.T) {
	b := setup(t)
	arrived := make(chan struct{}, 4)
	release := make(chan struct{})
	gate := func(ctx context.Context, in json.RawMessage) (json.RawMessage, error) {
		arrived <- struct{}{}
		select {
		case <-release:
			return in, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	b.Worker(t, "w1", paltest.Tools(map[string]workers.Tool{"gate": gate}))
	wf := `{"name":"lanes","nodes":[{"id":"start","type":"trigger"},
	  {"id":"b0","type":"tool","data":{"tool":"gate","input":{"n":0}}},{"id":"b1","type":"tool","data":{"tool":"gate","input":{"n":1}}},
	  {"id":"b2","type":"tool","data":{"tool":"gate","input":{"n":2}}},{"id":"b3","type":"tool","data":{"tool":"gate","input":{"n":3}}},
	  {"id":"join","type":"tool","data":{"tool":"echo","input":{"n":9}}}],
	  "edges":[{"from":"start","to":"b0"},{"from":"start","to":"b1"},{"from":"start","to":"b2"},{"from":"start","to":"b3"},
	   {"from":"b0","to":"join"},{"from":"b1","to":"join"},{"from":"b2","to":"join"},{"from":"b3","to":"join"}]}`
	id := b.Start(t, wf, `{}`)
	for range 4 {
		<-arrived
	}
	close(release)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, id).Kind)

	br := newBrowser(t)
	br.loginAt(b, "/runs/"+id, testToken)
	br.waitJS("the waterfall", `document.body.dataset.status === "succeeded" && document.querySelectorAll('.wf-row').length > 0`)
	require.Contains(t, eval[string](br, `document.querySelector('#run-meta').textContent`), "at most 4 steps at once")
	br.do(chromedp.Click(chromedp.CSS(`#lanes-view`)))
	br.waitJS("the lane view", `document.body.dataset.view === "lanes"`)

	type bar struct {
		Step  string  `json:"step"`
		Left  float64 `json:"left"`
		Width float64 `json:"width"`
	}
	lanes := eval[[][]bar](br, `[...document.querySelectorAll('.wf-row.lane')].map(r =>
	  [...r.querySelectorAll('.seg')].map(s => ({step: s.dataset.step, left: parseFloat(s.style.left), width: parseFloat(s.style.width)})))`)
	require.Len(t, lanes, 4, "one lane per branch in flight at once")
	var branches []bar
	at := map[string]int{}
	for i, lane := range lanes {
		for _, s := range lane {
			at[s.Step] = i
		}
		require.NotEmpty(t, lane)
		branches = append(branches, lane[0])
	}
	for i := range branches {
		for j := range branches {
			a, c := branches[i], branches[j]
			require.Less(t, a.Left, c.Left+c.Width, "%s and %s overlap", a.Step, c.Step)
		}
	}
	require.Len(t, at, 5)
	require.Contains(t, []int{0, 1, 2, 3}, at["join"])
	require.Len(t, lanes[at["join"]], 2, "the join follows a branch in its lane")
	br.screenshot(t, "lanes")

	br.do(chromedp.Click(chromedp.CSS(`.wf-row.lane .seg[data-step="join"]`)))
	br.waitJS("the join's detail", `!!document.querySelector('#detail h2') && document.querySelector('#detail h2').textContent === "join"`)
	// The detail panel covers the page's right side: close it first.
	br.do(chromedp.Click(chromedp.CSS(`#detail .close`)))
	br.waitJS("the detail closed", `document.querySelector('#detail').hidden`)
	br.do(chromedp.Click(chromedp.CSS(`#lanes-view`)))
	br.waitJS("the step view again", `document.body.dataset.view === "steps" && document.querySelectorAll('.wf-row[data-step]').length === 5`)
}

// TestBrowserLoopSpan: a loop journals its own step when it ends, yet
// while its first iteration runs its row is there, above the iteration's
// step and running, and once it ended its bar spans its iterations.
func TestBrowserLoopSpan(t *testing.T) {
	b := setup(t)
	release := make(chan struct{})
	b.Worker(t, "w1", paltest.Tools(map[string]workers.Tool{"gate": gateTool(release)}))
	wf := `{"name":"loopspan","nodes":[{"id":"start","type":"trigger"},
	  {"id":"each","type":"loop","data":{"over":"{{input.items}}","body":{"name":"one","nodes":[{"id":"start","type":"trigger"},
	    {"id":"t","type":"tool","data":{"tool":"gate","input":{"i":"{{input.item}}"}}}],"edges":[{"from":"start","to":"t"}]}}}],
	  "edges":[{"from":"start","to":"each"}]}`
	id := b.Start(t, wf, `{"items":[1,2]}`)
	b.WaitFor(t, id, "the first iteration", func(ev event.Event) bool { return ev.Kind == event.StepStarted && ev.StepID == "each[0].t" })

	type row struct {
		Step    string  `json:"step"`
		Type    string  `json:"type"`
		Outcome string  `json:"outcome"`
		Left    float64 `json:"left"`
		Right   float64 `json:"right"`
	}
	read := `[...document.querySelectorAll('.wf-row')].map(r => { const s = r.querySelector('.seg');
	  return {step: r.dataset.step, type: r.querySelector('.node-type').textContent, outcome: s ? s.dataset.outcome : "",
	    left: s ? parseFloat(s.style.left) : -1, right: s ? parseFloat(s.style.left) + parseFloat(s.style.width) : -1}; })`
	br := newBrowser(t)
	br.loginAt(b, "/runs/"+id, testToken)
	br.waitJS("the loop's row", `!!document.querySelector('.wf-row[data-step="each"] .seg.running') && !!document.querySelector('.wf-row[data-step="each[0].t"]')`)
	rows := eval[[]row](br, read)
	require.Len(t, rows, 2)
	require.Equal(t, []string{"each", "each[0].t"}, []string{rows[0].Step, rows[1].Step}, "the loop above its step")
	require.Equal(t, "loop", rows[0].Type)
	require.InDelta(t, rows[1].Left, rows[0].Left, 0.01, "the loop's bar starts with its first step")
	br.screenshot(t, "loop-running")

	close(release)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, id).Kind)
	br.waitJS("the finished loop", `document.body.dataset.status === "succeeded" && document.querySelectorAll('.wf-row').length === 3`)
	rows = eval[[]row](br, read)
	require.Equal(t, []string{"each", "each[0].t", "each[1].t"}, []string{rows[0].Step, rows[1].Step, rows[2].Step})
	require.Equal(t, "completed", rows[0].Outcome)
	require.InDelta(t, rows[1].Left, rows[0].Left, 0.01, "the loop's bar starts with its first step")
	require.GreaterOrEqual(t, rows[0].Right, rows[2].Right, "and ends after its last")
	br.screenshot(t, "loop-ended")
}
