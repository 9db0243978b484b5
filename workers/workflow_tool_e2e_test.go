package workers_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/paltest/testenv"
	"github.com/palrun/pal/provider"
	"github.com/palrun/pal/provider/providertest"
	"github.com/palrun/pal/runs"
)

// TestWorkflowToolKill9AdoptsTheChild: an agent lists the deployed
// workflow "summarise" as a tool, and the model calls it twice in one
// turn. Each call is one child run of the workflow (its deployed version
// in run_created), the child's output is the call's result in the next
// turn's request, and a kill -9 while a child is mid-step adopts that
// child: no third child, its step re-sent once with its key.
func TestWorkflowToolKill9AdoptsTheChild(t *testing.T) {
	t.Parallel()
	p := setupProc(t, time.Second)
	ctx := ctxFor(t, 2*time.Minute)
	child := `{"name":"summarise","nodes":[{"id":"start","type":"trigger"},
		{"id":"think","type":"ai-step","data":{"provider":"openai","model":"m","prompt":"summarise {{input.text}}"}}],
		"edges":[{"from":"start","to":"think"}]}`
	dep, err := runs.New(p.Store).Deploy(ctx, runs.DeployCommand{Workflow: json.RawMessage(child), By: "test", Rights: runs.AllRights})
	require.NoError(t, err)

	// The agent's model calls summarise twice, then answers with what the
	// calls returned; the children's model answers its prompt.
	var final []string
	p.LLM.SetResponder(func(c providertest.Call) providertest.Reply {
		if !slices.Contains(c.Tools, "summarise") {
			return providertest.Reply{Text: "short: " + c.Messages[len(c.Messages)-1].Content}
		}
		var results []string
		for _, m := range c.Messages {
			if m.Role == provider.RoleTool {
				results = append(results, m.Content)
			}
		}
		if len(results) == 0 {
			return providertest.Reply{ToolCalls: []provider.ToolCall{
				{ID: "c0", Name: "summarise", Arguments: json.RawMessage(`{"text":"alpha"}`)},
				{ID: "c1", Name: "summarise", Arguments: json.RawMessage(`{"text":"beta"}`)}}}
		}
		final = results
		return providertest.Reply{Text: strings.Join(results, " | ")}
	})
	wf := `{"name":"researcher","nodes":[{"id":"start","type":"trigger"},
		{"id":"ask","type":"agent","data":{"provider":"openai","model":"m","prompt":"go",
		 "tools":[{"workflow":"summarise","description":"summarise a text","parameters":{"type":"object","properties":{"text":{"type":"string"}}}}]}}],
		"edges":[{"from":"start","to":"ask"}]}`
	runID := event.NewRunID()
	first := event.ChildRunID(runID, "ask.turn[0].tool[0]")
	second := event.ChildRunID(runID, "ask.turn[0].tool[1]")
	hold := p.LLM.Hold(providertest.ByKey(key(first, "think", 1)))
	w1 := p.palWorker(t, "w1")
	_, err = runs.New(p.Store).Start(ctx, runs.StartCommand{Rights: runs.AllRights, RunID: runID, Workflow: json.RawMessage(wf)})
	require.NoError(t, err)
	_, err = hold.Wait(ctx)
	require.NoError(t, err)
	w1.Kill()
	p.palWorker(t, "w2")
	hold.Release()
	end := p.WaitEnd(t, runID)
	require.Equal(t, event.RunSucceeded, end.Kind, "%s", end.Data)

	// One child per call, each the deployed workflow, adopted not remade.
	j := testenv.ReadJournal(t, p.NC)
	var children []string
	for id, evs := range j {
		if cd := data[event.RunCreatedData](t, evs[0]); cd.ParentRunID == runID {
			children = append(children, id)
			require.NotNil(t, cd.Deployed, "a workflow tool's child carries its deployed version")
			require.Equal(t, "summarise", cd.Deployed.Name)
			require.Equal(t, dep.Version, cd.Deployed.Version)
		}
	}
	slices.Sort(children)
	want := []string{first, second}
	slices.Sort(want)
	require.Equal(t, want, children)
	require.Len(t, find(j[first], event.RunCreated, ""), 1)
	require.Equal(t, 2, p.LLM.Keys()[key(first, "think", 1)], "the held child step re-sent once, with its key")
	// The other child ran beside it: sent once, or again with its key if
	// its step had not been journaled complete when w1 died.
	require.Contains(t, []int{1, 2}, p.LLM.Keys()[key(second, "think", 1)])

	// The results are the children's outputs, in the model's order.
	require.Len(t, final, 2)
	for i, text := range []string{"alpha", "beta"} {
		var out struct {
			Text string `json:"text"`
		}
		require.NoError(t, json.Unmarshal([]byte(final[i]), &out), final[i])
		require.Equal(t, "short: summarise "+text, out.Text, "call %d's result is its child's output", i)
	}
}
