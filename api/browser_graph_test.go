package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/workers"
)

// graphWorkflow has a branch that fails (and lets the run go on), one
// that succeeds through a loop, a node its condition leaves unreached and
// a join: 7 edges, and 1 in the loop's body.
const graphWorkflow = `{"name":"graph","nodes":[{"id":"start","type":"trigger"},
  {"id":"ok","type":"tool","data":{"tool":"echo","input":{"n":1}}},
  {"id":"bad","type":"tool","data":{"tool":"boom","input":{}},"onFailure":"continue"},
  {"id":"fix","type":"tool","data":{"tool":"echo","input":{"n":2}}},
  {"id":"skip","type":"tool","data":{"tool":"echo","input":{"n":3}}},
  {"id":"each","type":"loop","data":{"over":"{{input.items}}","body":{"name":"one","nodes":[{"id":"start","type":"trigger"},
    {"id":"t","type":"tool","data":{"tool":"echo","input":{"i":"{{input.item}}"}}}],"edges":[{"from":"start","to":"t"}]}}},
  {"id":"done","type":"tool","data":{"tool":"echo","input":{"n":4}}}],
  "edges":[{"from":"start","to":"ok"},{"from":"start","to":"bad"},
    {"from":"bad","to":"fix","condition":"steps.bad.status == \"failed\""},
    {"from":"bad","to":"skip","condition":"steps.bad.status == \"completed\""},
    {"from":"ok","to":"each"},{"from":"each","to":"done"},{"from":"fix","to":"done"}]}`

// TestBrowserGraph: the Graph tab of a run with a failed branch and a
// succeeded one draws every node of its workflow (the loop's body too)
// with its outcome's class, one SVG edge per edge of the workflow and a
// link from the loop to its body; a click on a node opens its step's
// detail, the same panel as the waterfall's (a loop body's node: its
// latest iteration); a node not reached opens none. At 800 px the graph
// scrolls in its box, and the panel covers neither it nor the legend. A
// workflow of 1,000 nodes, the most validation allows, is drawn whole.
func TestBrowserGraph(t *testing.T) {
	b := setup(t)
	boom := func(context.Context, json.RawMessage) (json.RawMessage, error) {
		return nil, &workers.ToolError{Err: errors.New("boom: the service said no")}
	}
	b.Worker(t, "w1", paltest.Tools(map[string]workers.Tool{"boom": boom}))
	id := b.Start(t, graphWorkflow, `{"items":[1,2]}`)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, id).Kind)

	br := newBrowser(t)
	br.loginAt(b, "/runs/"+id, testToken)
	br.waitJS("the waterfall", `document.body.dataset.status === "succeeded" && document.querySelectorAll('.wf-row').length > 0`)
	br.do(chromedp.Click(chromedp.CSS(`#tab-graph`)))
	br.waitJS("the graph", `document.body.dataset.tab === "graph" && document.querySelectorAll('#graph-box .gnode').length > 0`)
	require.Equal(t, "#graph", eval[string](br, `location.hash`))

	type node struct {
		Class  string `json:"class"`
		Status string `json:"status"`
		Step   string `json:"step"`
		Text   string `json:"text"`
	}
	nodes := eval[map[string]node](br, `Object.fromEntries([...document.querySelectorAll('#graph-box .gnode')].map(n =>
	  [n.dataset.node, {class: n.getAttribute('class'), status: n.dataset.status, step: n.dataset.step, text: [...n.querySelectorAll('text')].map(x => x.textContent).join(' ')}]))`)
	want := map[string]string{"start": "completed", "ok": "completed", "bad": "failed", "fix": "completed", "skip": "not_reached",
		"each": "completed", "done": "completed", "each/start": "completed", "each/t": "completed"}
	require.Len(t, nodes, len(want))
	for id, status := range want {
		require.Contains(t, nodes[id].Class, "status-"+status, "node %s", id)
		require.Equal(t, status, nodes[id].Status, "node %s", id)
	}
	require.Equal(t, "bad tool", nodes["bad"].Text, "labelled by id and type")
	require.Equal(t, "each/t tool · 2 steps", nodes["each/t"].Text, "a body node by its path")
	require.Equal(t, "each[1].t", nodes["each/t"].Step, "a body node opens its latest iteration")
	require.Empty(t, nodes["skip"].Step)

	// One SVG edge per workflow edge (7 at the top, 1 in the body), and
	// the loop's link to its body apart.
	type edge struct{ From, To string }
	edges := eval[[]edge](br, `[...document.querySelectorAll('#graph-box path.edge')].map(p => ({From: p.dataset.from, To: p.dataset.to}))`)
	require.ElementsMatch(t, []edge{{"start", "ok"}, {"start", "bad"}, {"bad", "fix"}, {"bad", "skip"}, {"ok", "each"}, {"each", "done"},
		{"fix", "done"}, {"each/start", "each/t"}}, edges)
	require.Equal(t, 2, eval[int](br, `document.querySelectorAll('#graph-box path.edge.conditional').length`))
	require.Equal(t, 1, eval[int](br, `document.querySelectorAll('#graph-box path.contains').length`))
	// Laid out in layers from the trigger: every edge runs rightwards.
	require.True(t, eval[bool](br, `[...document.querySelectorAll('#graph-box path.edge')].every(p => {
	  const x = id => document.querySelector('.gnode[data-node="' + id + '"]').getBoundingClientRect().left;
	  return x(p.dataset.from) < x(p.dataset.to); })`))
	br.screenshot(t, "graph")

	// A node opens its step's detail; the waterfall's panel.
	br.do(chromedp.Click(chromedp.CSS(`.gnode[data-node="bad"] .box`)))
	br.waitJS("bad's detail", `!document.querySelector('#detail').hidden && document.querySelector('#detail h2').textContent === "bad"`)
	require.Contains(t, eval[string](br, `document.querySelector('#detail').textContent`), "boom: the service said no")
	require.Contains(t, eval[string](br, `document.querySelector('.gnode[data-node="bad"]').getAttribute('class')`), "selected")
	br.screenshot(t, "graph-detail")
	br.do(chromedp.Click(chromedp.CSS(`.gnode[data-node="each/t"] .box`)))
	br.waitJS("the body node's detail", `document.querySelector('#detail h2').textContent === "each[1].t"`)
	br.do(chromedp.Click(chromedp.CSS(`.gnode[data-node="skip"] .box`)))
	br.waitJS("no detail for a node not reached", `document.querySelector('#detail').hidden`)

	// At 800 px: the graph keeps to its box (which scrolls), and the
	// detail panel, below the page, covers neither it nor the legend.
	br.do(chromedp.EmulateViewport(800, 900))
	br.waitJS("the narrow page", `window.innerWidth === 800`)
	br.clickJS(`.gnode[data-node="ok"] .box`)
	br.waitJS("ok's detail", `!document.querySelector('#detail').hidden && document.querySelector('#detail h2').textContent === "ok"`)
	require.True(t, eval[bool](br, `document.documentElement.scrollWidth <= 800`), "nothing scrolls the page sideways")
	require.False(t, overlaps(br, "#detail", "#graph .legend"))
	require.False(t, overlaps(br, "#detail", "#graph-box"))
	br.screenshot(t, "graph-800")

	// The largest workflow validation allows, 1,000 nodes: a chain of
	// 998 behind a condition that is false, so the run ends at once and
	// every node is drawn, 997 of them not reached.
	var nodesJSON, edgesJSON strings.Builder
	nodesJSON.WriteString(`{"id":"start","type":"trigger"},{"id":"a","type":"tool","data":{"tool":"echo","input":{}}}`)
	edgesJSON.WriteString(`{"from":"start","to":"a"},{"from":"a","to":"n0","condition":"input.go == true"}`)
	for i := range 998 {
		fmt.Fprintf(&nodesJSON, `,{"id":"n%d","type":"tool","data":{"tool":"echo","input":{}}}`, i)
		if i > 0 {
			fmt.Fprintf(&edgesJSON, `,{"from":"n%d","to":"n%d"}`, i-1, i)
		}
	}
	big := b.Start(t, `{"name":"big","nodes":[`+nodesJSON.String()+`],"edges":[`+edgesJSON.String()+`]}`, `{"go":false}`)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, big).Kind)
	br.do(chromedp.EmulateViewport(1400, 900), chromedp.Navigate(b.url+"/runs/"+big+"#graph"))
	br.waitJS("the large graph", `document.body.dataset.status === "succeeded" && document.querySelectorAll('#graph-box .gnode').length === 1000`)
	require.Equal(t, 999, eval[int](br, `document.querySelectorAll('#graph-box path.edge').length`))
	require.Equal(t, 998, eval[int](br, `document.querySelectorAll('#graph-box .gnode.status-not_reached').length`))
	t.Logf("1,000 nodes: layout %s ms, drawing %s ms", eval[string](br, `document.querySelector('#graph-box').dataset.layoutMs`),
		eval[string](br, `document.querySelector('#graph-box').dataset.drawMs`))
	require.True(t, eval[bool](br, `document.documentElement.scrollWidth <= window.innerWidth`), "the graph scrolls in its box, not the page")
	br.screenshot(t, "graph-1000")
}

// overlaps reports whether the first elements selectors a and b select
// are both shown and have intersecting bounding rectangles.
func overlaps(br *browser, a, b string) bool {
	br.t.Helper()
	return eval[bool](br, fmt.Sprintf(`((a, b) => { const r = document.querySelector(a).getBoundingClientRect(), s = document.querySelector(b).getBoundingClientRect();
	  return r.width > 0 && s.width > 0 && r.left < s.right && s.left < r.right && r.top < s.bottom && s.top < r.bottom; })(%q, %q)`, a, b))
}

// TestBrowserAxis: a run that waited seconds for a signal between steps of
// a tenth of a second. The compressed axis draws the wait as a break
// labelled with its real length, the ticks on each side of it true to
// real times, and the steps at least twice as wide as the linear axis
// does (and wider than 60 px); the toggle switches to the linear axis,
// which has no break; a drag across the axis zooms into a bar. At 1400 px and at 800 px the step detail panel
// overlaps neither the legend nor its buttons, and nothing scrolls
// sideways.
func TestBrowserAxis(t *testing.T) {
	b := setup(t)
	slow := func(ctx context.Context, in json.RawMessage) (json.RawMessage, error) {
		select {
		case <-time.After(100 * time.Millisecond): // a step that takes a tenth of a second
			return in, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	b.Worker(t, "w1", paltest.Tools(map[string]workers.Tool{"slow": slow}))
	wf := `{"name":"axis","nodes":[{"id":"start","type":"trigger"},
	  {"id":"a","type":"tool","data":{"tool":"slow","input":{"n":1}}},
	  {"id":"hold","type":"wait","data":{"signal":"go"}},
	  {"id":"c","type":"tool","data":{"tool":"slow","input":{"n":2}}}],
	  "edges":[{"from":"start","to":"a"},{"from":"a","to":"hold"},{"from":"hold","to":"c"}]}`
	id := b.Start(t, wf, `{}`)
	b.WaitFor(t, id, "the wait", func(ev event.Event) bool { return ev.Kind == event.StepWaiting })
	time.Sleep(3 * time.Second) // the wait's length is what the test draws
	require.Equal(t, http.StatusOK, b.post(t, "/v1/runs/"+id+"/signals/go", `{}`).status)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, id).Kind)

	br := newBrowser(t)
	br.loginAt(b, "/runs/"+id, testToken)
	br.waitJS("the compressed axis", `document.body.dataset.status === "succeeded" && document.body.dataset.axis === "compressed" && !!document.querySelector('#axis .axis-break')`)
	width := func(step string) float64 {
		return eval[float64](br, `document.querySelector('.wf-row[data-step="`+step+`"] .seg').getBoundingClientRect().width`)
	}
	type tick struct {
		Ms   float64 `json:"ms"`
		Left float64 `json:"left"`
		Text string  `json:"text"`
	}
	ticks := func() []tick {
		return eval[[]tick](br, `[...document.querySelectorAll('#axis .tick')].map(t => ({ms: parseFloat(t.dataset.ms), left: t.getBoundingClientRect().left, text: t.textContent}))`)
	}
	require.Equal(t, 1, eval[int](br, `document.querySelectorAll('#axis .axis-break').length`))
	brk := eval[tick](br, `(() => { const b = document.querySelector('#axis .axis-break'); return {ms: parseFloat(b.dataset.ms), left: b.getBoundingClientRect().right, text: b.textContent}; })()`)
	require.GreaterOrEqual(t, brk.Ms, 3000.0, "the break is the wait's real length")
	require.Regexp(t, `^\d+\.\d+ s$`, brk.Text)
	require.Equal(t, 1, eval[int](br, `document.querySelectorAll('#overlay .wf-break').length`), "drawn across the rows")
	compressed := map[string]float64{"a": width("a"), "c": width("c")}
	tc := ticks()
	var before, after bool
	for i, k := range tc {
		if i > 0 {
			require.Greater(t, k.Ms, tc[i-1].Ms, "ticks left to right are later and later")
			require.Greater(t, k.Left, tc[i-1].Left)
		}
		before = before || (k.Left < brk.Left && k.Ms < 1000)
		after = after || (k.Left >= brk.Left-1 && k.Ms >= brk.Ms)
	}
	require.True(t, before && after, "ticks on each side of the break: %+v", tc)
	br.screenshot(t, "axis-compressed")

	br.do(chromedp.Click(chromedp.CSS(`#axis-mode`)))
	br.waitJS("the linear axis", `document.body.dataset.axis === "linear" && !document.querySelector('#axis .axis-break')`)
	require.Zero(t, eval[int](br, `document.querySelectorAll('#overlay .wf-break').length`))
	for _, step := range []string{"a", "c"} {
		linear := width(step)
		require.Greater(t, compressed[step], 2*linear, "step %s: compressed %.0f px, linear %.0f px", step, compressed[step], linear)
		require.Greater(t, compressed[step], 60.0, "step %s", step)
	}
	br.screenshot(t, "axis-linear")
	br.do(chromedp.Click(chromedp.CSS(`#axis-mode`)))
	br.waitJS("the compressed axis again", `document.body.dataset.axis === "compressed"`)

	// A drag across the axis over c's bar zooms into it: c fills most of
	// the track, and every tick is a real time after the wait.
	type rect struct{ Left, Right, Y float64 }
	bar := eval[rect](br, `(() => { const r = document.querySelector('.wf-row[data-step="c"] .seg').getBoundingClientRect(),
	  a = document.querySelector('#axis').getBoundingClientRect(); return {Left: r.left, Right: r.right, Y: a.top + a.height / 2}; })()`)
	br.do(chromedp.MouseEvent(chromedp.MousePressed, bar.Left+1, bar.Y, chromedp.ButtonLeft, chromedp.ClickCount(1)),
		chromedp.MouseEvent(chromedp.MouseMoved, (bar.Left+bar.Right)/2, bar.Y, chromedp.ButtonLeft),
		chromedp.MouseEvent(chromedp.MouseMoved, bar.Right-1, bar.Y, chromedp.ButtonLeft),
		chromedp.MouseEvent(chromedp.MouseReleased, bar.Right-1, bar.Y, chromedp.ButtonLeft, chromedp.ClickCount(1)))
	br.waitJS("the zoomed axis", `document.body.dataset.axis === "zoomed" && !document.querySelector('#zoom-reset').hidden`)
	track := eval[float64](br, `document.querySelector('#axis').getBoundingClientRect().width`)
	require.Greater(t, width("c"), 0.9*track, "c fills the zoomed track")
	for _, k := range ticks() {
		require.GreaterOrEqual(t, k.Ms, brk.Ms, "a tick of the zoomed stretch: %+v", k)
	}
	require.Zero(t, eval[int](br, `document.querySelectorAll('#overlay .marker').length`), "the drives lie before the stretch shown")
	br.screenshot(t, "axis-zoomed")
	br.do(chromedp.Click(chromedp.CSS(`#zoom-reset`)))
	br.waitJS("the compressed axis after the zoom", `document.body.dataset.axis === "compressed" && document.querySelector('#zoom-reset').hidden`)

	// The detail panel beside the page at 1400 px, below it at 800 px:
	// it covers neither the legend nor its buttons.
	for _, w := range []int64{1400, 800} {
		br.do(chromedp.EmulateViewport(w, 900))
		br.waitJS("the window's width", `window.innerWidth === `+jsInt(w))
		br.clickJS(`.wf-row[data-step="hold"] .step-id`) // the resize redraws the rows
		br.waitJS("hold's detail", `!document.querySelector('#detail').hidden && document.querySelector('#detail h2').textContent === "hold"`)
		for _, sel := range []string{"#view-waterfall .legend", "#expand-all", "#collapse-all", "#lanes-view", "#axis-mode", "#axis", "#actions", ".top"} {
			require.False(t, overlaps(br, "#detail", sel), "at %d px the detail panel covers %s", w, sel)
		}
		require.True(t, eval[bool](br, `document.documentElement.scrollWidth <= window.innerWidth`), "at %d px nothing scrolls sideways", w)
		require.Equal(t, "compressed", eval[string](br, `document.body.dataset.axis`), "at %d px", w)
		br.screenshot(t, "detail-"+jsInt(w))
		br.clickJS(`#detail .close`)
		br.waitJS("the detail closed", `document.querySelector('#detail').hidden`)
	}
}

func jsInt(n int64) string { return strconv.FormatInt(n, 10) }
