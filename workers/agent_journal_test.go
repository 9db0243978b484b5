package workers_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/paltest/testenv"
	"github.com/palrun/pal/provider"
	"github.com/palrun/pal/provider/providertest"
)

// TestAgentJournalPerTurnIsBounded runs a 200-turn agent (199 tool calls,
// then an answer): each turn journals only the messages added since the
// previous one, so a late turn costs the journal what an early one does,
// while the model still gets the whole conversation every turn.
func TestAgentJournalPerTurnIsBounded(t *testing.T) {
	t.Parallel()
	const turns = 200
	b := setup(t)
	b.worker(t, "w1", nil)
	b.LLM.SetResponder(func(c providertest.Call) providertest.Reply {
		tools := 0
		for _, m := range c.Messages {
			if m.Role == provider.RoleTool {
				tools++
			}
		}
		if tools < turns-1 {
			return providertest.Reply{ToolCalls: []provider.ToolCall{{ID: fmt.Sprintf("call_%d", tools), Name: "echo",
				Arguments: json.RawMessage(fmt.Sprintf(`{"n":%d}`, tools))}}}
		}
		return providertest.Reply{Text: fmt.Sprintf("done after %d tools", tools)}
	})
	wf := fmt.Sprintf(`{"name":"long","nodes":[{"id":"start","type":"trigger"},
		{"id":"ask","type":"agent","data":{"provider":"openai","model":"gpt-4o-mini","prompt":"go","maxTurns":%d,"tools":[{"name":"echo"}]}}],
		"edges":[{"from":"start","to":"ask"}]}`, turns)
	runID := b.Start(t, wf, `{}`)
	final := b.WaitEnd(t, runID)
	require.Equal(t, event.RunSucceeded, final.Kind, "%s", final.Data)
	require.JSONEq(t, fmt.Sprintf(`{"text":"done after %d tools","turns":%d}`, turns-1, turns),
		string(data[event.RunSucceededData](t, final).Output))

	// The last call carried the whole conversation: the prompt, and an
	// answer and a tool result per earlier turn.
	last := b.LLM.CallsWithKey(key(runID, fmt.Sprintf("ask.turn[%d]", turns-1), 1))
	require.Len(t, last, 1)
	require.Len(t, last[0].Messages, 1+2*(turns-1))

	// Journal bytes per turn, as stored: the turn's events and its tool
	// call's.
	perTurn := make([]int, turns)
	for _, ev := range testenv.ReadJournal(t, b.NC)[runID] {
		var k int
		if _, err := fmt.Sscanf(ev.StepID, "ask.turn[%d]", &k); err != nil {
			continue
		}
		body, err := json.Marshal(ev)
		require.NoError(t, err)
		perTurn[k] += len(body)
	}
	total := 0
	for _, n := range perTurn {
		total += n
	}
	// For scale: what the turns' requests weigh, which a turn journaling
	// its whole conversation would have added to the journal.
	var sent int
	for _, c := range b.LLM.Calls() {
		sent += len(c.Body)
	}
	t.Logf("journal bytes: turn 10 %d, turn 199 %d, turn 200 %d; all %d turns %d (their requests: %d, the last %d)",
		perTurn[9], perTurn[turns-2], perTurn[turns-1], turns, total, sent, len(last[0].Body))
	require.LessOrEqual(t, perTurn[turns-2], 2*perTurn[9], "turn 199 (a tool call, like turn 10)")
	require.LessOrEqual(t, perTurn[turns-1], 2*perTurn[9], "turn 200 (the answer)")
	require.Less(t, total, turns*2*perTurn[9], "the journal grows with the turns")

	// Each turn's step_started records only its new messages.
	for _, ev := range find(b.Events(t, runID), event.StepStarted, "") {
		if !strings.Contains(ev.StepID, ".turn[") || strings.Contains(ev.StepID, ".tool[") {
			continue
		}
		var in engine.AIInput
		require.NoError(t, json.Unmarshal(data[event.StepStartedData](t, ev).Input, &in))
		if ev.StepID == "ask.turn[0]" {
			require.Zero(t, in.Prior)
			require.Len(t, in.Messages, 1)
			continue
		}
		require.Len(t, in.Messages, 2, ev.StepID)
		require.Equal(t, provider.RoleAssistant, in.Messages[0].Role)
		require.Equal(t, provider.RoleTool, in.Messages[1].Role)
	}
}
