package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/provider/providertest"
)

// TestBrowserJournal: a run that one worker drove until it stopped in the
// middle of a step, and another took over and finished. Its page's
// Journal tab, opened in the middle of the step, follows the run to its
// end and lists every event of the journal in seq order with its
// kind, step, writer and prev; each run_resumed (both drives) is marked,
// the second as a takeover; a payload is folded until a click opens it,
// and a nested object in it folds on its own; a payload holding markup is
// shown as text; the tab is usable 800 px wide.
func TestBrowserJournal(t *testing.T) {
	b := setup(t)
	hold := b.LLM.Hold(func(c providertest.Call) bool { return strings.Contains(c.LastUser(), "step 2") })
	t.Cleanup(hold.Release)
	w1 := b.Worker(t, "w1")
	in, err := json.Marshal(map[string]string{"topic": xss})
	require.NoError(t, err)
	id := b.Start(t, seqWorkflow(3), string(in))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, err = hold.Wait(ctx)
	require.NoError(t, err)

	// The tab opened while w1 is in the middle of step 2 lists the
	// journal so far.
	br := newBrowser(t)
	br.loginAt(b, "/runs/"+id, testToken)
	br.waitJS("the waterfall", `document.body.dataset.status === "running"`)
	br.do(chromedp.Click(chromedp.CSS(`#tab-journal`)))
	br.waitJS("the journal tab", `document.body.dataset.tab === "journal" && !document.querySelector('#journal').hidden && document.querySelector('#view-waterfall').hidden`)
	sofar := b.Events(t, id)
	br.waitJS("the journal so far", fmt.Sprintf(`+document.querySelector('#journal-rows').dataset.lastSeq >= %d`, sofar[len(sofar)-1].Seq))
	require.Equal(t, "false", eval[string](br, `document.querySelector('#journal-rows').dataset.ended`))
	eval[chromedp.Void](br, `window.__samePage = true`)

	// w1 stops in the middle of step 2 and hands the run on; w2 takes it.
	require.NoError(t, w1.Stop(ctx))
	hold.Release()
	b.Worker(t, "w2")
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, id).Kind)
	evs := b.Events(t, id)
	var resumes []event.Event
	for _, ev := range evs {
		if ev.Kind == event.RunResumed {
			resumes = append(resumes, ev)
		}
	}
	require.Len(t, resumes, 2, "two drives")
	var second event.RunResumedData
	require.NoError(t, resumes[1].DecodeData(&second))
	require.Equal(t, "w2", second.Worker)
	require.True(t, second.Crashed, "w2 took over a drive that did not finish")

	// The rest comes live, the takeover among it, without a reload.
	br.waitJS("every event listed", fmt.Sprintf(`document.querySelector('#journal-rows').dataset.ended === "true" && document.querySelectorAll('#journal-rows .jr-event').length === %d`, len(evs)))
	require.True(t, eval[bool](br, `window.__samePage === true`), "the tab followed the run without a reload")

	// Every event, in seq order, as the journal has it.
	type listed struct {
		Seq    uint64 `json:"seq"`
		Kind   string `json:"kind"`
		Step   string `json:"step"`
		Writer string `json:"writer"`
		Prev   string `json:"prev"`
		TS     string `json:"ts"`
	}
	rows := eval[[]listed](br, `[...document.querySelectorAll('#journal-rows .jr-event')].map(r => ({seq: +r.dataset.seq, kind: r.dataset.kind,
	  step: r.querySelector('.jr-step').textContent, writer: r.querySelector('.jr-writer').textContent,
	  prev: r.querySelector('.jr-prev').title, ts: r.querySelector('.jr-ts').title}))`)
	require.Len(t, rows, len(evs))
	for i, ev := range evs {
		r := rows[i]
		require.Equal(t, ev.Seq, r.Seq, "row %d", i)
		require.Equal(t, string(ev.Kind), r.Kind, "seq %d", ev.Seq)
		step := ""
		if ev.StepID != "" {
			step = ev.StepID
			if ev.Attempt != 0 {
				step += fmt.Sprintf(" #%d", ev.Attempt)
			}
		}
		require.Equal(t, step, r.Step, "seq %d", ev.Seq)
		require.Equal(t, ev.WorkerID, r.Writer, "seq %d", ev.Seq)
		if ev.Prev == "" {
			require.Equal(t, uint64(1), ev.Seq)
		} else {
			require.Equal(t, "prev: "+ev.Prev, r.Prev, "seq %d: the full link in the title", ev.Seq)
		}
		ts, err := time.Parse(time.RFC3339Nano, r.TS)
		require.NoError(t, err)
		require.True(t, ev.TS.Equal(ts), "seq %d", ev.Seq)
	}
	require.Equal(t, "w2", rows[len(rows)-1].Writer, "the second drive finished the run")

	// A marker on each run_resumed, the second a takeover, and on no other
	// row.
	type drive struct {
		Seq         uint64 `json:"seq"`
		Badge       string `json:"badge"`
		Interrupted bool   `json:"interrupted"`
	}
	drives := eval[[]drive](br, `[...document.querySelectorAll('#journal-rows .jr-event.drive')].map(r => ({seq: +r.dataset.seq,
	  badge: r.querySelector('.drive-badge').textContent, interrupted: r.classList.contains('interrupted')}))`)
	require.Equal(t, []drive{
		{Seq: resumes[0].Seq, Badge: "drive 1 · w1"},
		{Seq: resumes[1].Seq, Badge: "drive 2 · w2 · previous drive interrupted", Interrupted: true},
	}, drives)
	require.Equal(t, 2, eval[int](br, `document.querySelectorAll('#journal-rows .drive-badge').length`))
	require.True(t, eval[bool](br, fmt.Sprintf(`document.querySelector('#journal-rows .jr-event[data-seq="%d"] .drive-badge').getBoundingClientRect().width > 0`, resumes[1].Seq)),
		"the second drive's marker is visible")

	// Payloads start folded; a click opens one, a nested object in it
	// opens on its own, and a click folds it again.
	require.Equal(t, 0, eval[int](br, `[...document.querySelectorAll('#journal-rows .jr-payload')].filter(p => p.checkVisibility()).length`), "folded by default")
	var done event.Event
	for _, ev := range evs {
		if ev.Kind == event.StepCompleted && ev.StepID == "s2" {
			done = ev
		}
	}
	require.NotZero(t, done.Seq)
	sel := fmt.Sprintf(`#journal-rows .jr-event[data-seq="%d"]`, done.Seq)
	visible := func(what string) bool {
		return eval[bool](br, fmt.Sprintf(`(el => !!el && el.checkVisibility())(document.querySelector('%s %s'))`, sel, what))
	}
	br.do(chromedp.Click(chromedp.CSS(sel + ` .jr-toggle`)))
	br.waitJS("the payload unfolded", fmt.Sprintf(`(p => !!p && p.checkVisibility())(document.querySelector('%s .jr-payload'))`, sel))
	keys := eval[[]string](br, fmt.Sprintf(`[...document.querySelectorAll('%s .jr-payload > .json-node > .json-members > .json-member > .json-key')].map(k => k.textContent)`, sel))
	require.Contains(t, keys, `"output"`)
	require.Contains(t, keys, `"usage"`)
	usage := sel + ` .jr-payload > .json-node > .json-members > .json-member:nth-child(` +
		fmt.Sprint(slices.Index(keys, `"usage"`)+1) + `) > .json-node`
	require.False(t, eval[bool](br, fmt.Sprintf(`!!document.querySelector('%s > .json-members')`, usage)), "a nested object starts folded")
	br.do(chromedp.Click(chromedp.CSS(usage + ` > .json-toggle`)))
	br.waitJS("the usage unfolded", fmt.Sprintf(`(m => !!m && m.checkVisibility())(document.querySelector('%s > .json-members'))`, usage))
	require.Contains(t, eval[string](br, fmt.Sprintf(`document.querySelector('%s > .json-members').textContent`, usage)), `"total_tokens"`)
	br.do(chromedp.Click(chromedp.CSS(usage + ` > .json-toggle`)))
	br.waitJS("the usage folded", fmt.Sprintf(`!document.querySelector('%s > .json-members').checkVisibility()`, usage))
	require.True(t, visible(".jr-payload"), "folding the nested object leaves the payload open")

	// Markup in a payload is text: the run's input holds a script.
	created := `#journal-rows .jr-event[data-seq="1"]`
	br.do(chromedp.Click(chromedp.CSS(created + ` .jr-toggle`)))
	br.waitJS("run_created's payload", fmt.Sprintf(`document.querySelector('%s .jr-payload').checkVisibility()`, created))
	require.Contains(t, eval[string](br, `document.querySelector('#journal-rows').textContent`), "<script>window.__pwned=1</script>")
	require.True(t, eval[bool](br, `window.__pwned === undefined`))
	require.Equal(t, 0, eval[int](br, `document.querySelectorAll('#journal img, #journal script').length`))
	br.do(chromedp.Click(chromedp.CSS(created + ` .jr-toggle`)))
	br.waitJS("run_created's payload folded", fmt.Sprintf(`!document.querySelector('%s .jr-payload').checkVisibility()`, created))

	// 800 px wide, nothing of the tab is cut off or scrolls sideways.
	br.do(chromedp.EmulateViewport(800, 900))
	br.waitJS("the narrow page", `window.innerWidth === 800`)
	require.True(t, eval[bool](br, `document.documentElement.scrollWidth <= window.innerWidth`), "no sideways scroll at 800 px")
	require.True(t, eval[bool](br, `[...document.querySelectorAll('#journal .jr-head > span')].every(s => s.scrollWidth <= s.clientWidth)`), "the column heads fit")
	br.screenshot(t, "journal")

	// The waterfall tab is back as it was; #journal opens the journal.
	br.do(chromedp.Click(chromedp.CSS(`#tab-waterfall`)))
	br.waitJS("the waterfall tab", `document.body.dataset.tab === "waterfall" && !document.querySelector('#view-waterfall').hidden && document.querySelector('#journal').hidden`)
	eval[chromedp.Void](br, `location.hash = "journal"`)
	br.waitJS("the journal, opened by its address", `document.body.dataset.tab === "journal"`)
	br.do(chromedp.Reload())
	br.waitJS("the journal after a reload", fmt.Sprintf(`document.body.dataset.tab === "journal" && document.querySelectorAll('#journal-rows .jr-event').length === %d`, len(evs)))
}
