package api_test

import (
	"encoding/json"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/provider/providertest"
)

// TestBrowserConversation: an agent's detail panel shows its conversation
// from the journaled turns: the system prompt, the user's prompt, the
// model's tool call, the tool's result and the final answer, once each
// and in order; a turn's panel shows the conversation up to it. Markup in
// the prompt is text. The tool call's row is labelled by its tool.
func TestBrowserConversation(t *testing.T) {
	b := setup(t, withWorker())
	b.LLM.SetResponder(providertest.ToolUser)
	wf := `{"name":"agent","nodes":[{"id":"start","type":"trigger"},
	  {"id":"ask","type":"agent","data":{"provider":"openai","model":"gpt-4o-mini","system":"be brief","prompt":"look up {{input.q}}","tools":[{"name":"echo"}]}}],
	  "edges":[{"from":"start","to":"ask"}]}`
	in, err := json.Marshal(map[string]string{"q": xss})
	require.NoError(t, err)
	id := b.Start(t, wf, string(in))
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, id).Kind)

	br := newBrowser(t)
	br.loginAt(b, "/runs/"+id, testToken)
	br.waitJS("the agent's turns", `document.body.dataset.status === "succeeded" && !!document.querySelector('.wf-row[data-step="ask.turn[1]"]')`)
	// A tool call is labelled by its tool; the agent and its turns by
	// their node type.
	labels := eval[map[string]string](br, `Object.fromEntries([...document.querySelectorAll('.wf-row')].map(r =>
	  [r.dataset.step, r.querySelector('.node-type').textContent]))`)
	require.Equal(t, map[string]string{"ask": "agent", "ask.turn[0]": "agent", "ask.turn[0].tool[0]": "echo", "ask.turn[1]": "agent"}, labels)
	br.do(chromedp.Click(chromedp.CSS(`.wf-row[data-step="ask"] .step-id`)))
	br.waitJS("the conversation", `!!document.querySelector('#detail .conversation')`)
	type msg struct {
		Role  string   `json:"role"`
		Text  string   `json:"text"`
		Tools []string `json:"tools"`
	}
	read := `[...document.querySelectorAll('#detail .conversation .msg')].map(m => ({role: m.dataset.role,
	  text: (m.querySelector(':scope > pre.content') || {textContent: ""}).textContent,
	  tools: [...m.querySelectorAll('.tool-call')].map(c => c.dataset.tool)}))`
	got := eval[[]msg](br, read)
	require.Equal(t, []msg{
		{Role: "system", Text: "be brief", Tools: []string{}},
		{Role: "user", Text: "look up " + xss, Tools: []string{}},
		{Role: "assistant", Text: "", Tools: []string{"echo"}},
		{Role: "tool", Text: "{}", Tools: []string{}},
		{Role: "assistant", Text: "echo: look up " + xss + " (echo returned {})", Tools: []string{}},
	}, got)
	require.True(t, eval[bool](br, `window.__pwned === undefined`))
	require.Equal(t, 0, eval[int](br, `document.querySelectorAll('#detail img, #detail script').length`))
	br.screenshot(t, "conversation")

	// The first turn's panel: the conversation up to its tool call.
	br.do(chromedp.Click(chromedp.CSS(`.wf-row[data-step="ask.turn[0]"] .step-id`)))
	br.waitJS("the first turn's conversation", `document.querySelector('#detail h2').textContent === "ask.turn[0]" && !!document.querySelector('#detail .conversation')`)
	got = eval[[]msg](br, read)
	require.Equal(t, []string{"system", "user", "assistant"}, []string{got[0].Role, got[1].Role, got[2].Role})
	require.Len(t, got, 3)
	require.Equal(t, []string{"echo"}, got[2].Tools)
}
