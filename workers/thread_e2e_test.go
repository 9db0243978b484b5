package workers_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/paltest/testenv"
	"github.com/palrun/pal/provider"
	"github.com/palrun/pal/provider/providertest"
	"github.com/palrun/pal/runs"
)

// threadWorkflow is one ai-step that continues the run's thread.
const threadWorkflow = `{"name":"chat","nodes":[{"id":"start","type":"trigger"},
	{"id":"ask","type":"ai-step","data":{"provider":"openai","model":"m","prompt":"{{input.q}}","thread":true}}],
	"edges":[{"from":"start","to":"ask"}]}`

// startOnThread starts threadWorkflow as run runID on thread with
// question q.
func startOnThread(t *testing.T, p *procBundle, runID, thread, q string) {
	t.Helper()
	_, err := runs.New(p.Store).Start(context.Background(), runs.StartCommand{Rights: runs.AllRights, RunID: runID,
		Workflow: json.RawMessage(threadWorkflow), Input: json.RawMessage(`{"q":"` + q + `"}`), Thread: thread, By: "test"})
	require.NoError(t, err)
}

// turnsOf are a thread's turns as "run role content", in order.
func turnsOf(v *runs.ThreadView) [][3]string {
	var out [][3]string
	for _, tr := range v.Turns {
		out = append(out, [3]string{tr.RunID, tr.Role, tr.Content})
	}
	return out
}

// TestThreadSecondRunWaitsForTheFirst: two runs on one thread, the second
// started while the first is in its LLM step (held at the provider). The
// second waits, visibly (its step's sub-step "thread" runs, journaled),
// and calls the model only after the first's turns are in the thread;
// its request starts with them. The thread then holds the four turns in
// order, each once, and no run holds it.
func TestThreadSecondRunWaitsForTheFirst(t *testing.T) {
	t.Parallel()
	p := setupProc(t, time.Second)
	ctx := ctxFor(t, 2*time.Minute)
	p.palWorker(t, "w1")
	p.palWorker(t, "w2")
	first, second := event.NewRunID(), event.NewRunID()
	hold := p.LLM.Hold(providertest.ByKey(key(first, "ask", 1)))
	startOnThread(t, p, first, "support-42", "my printer is on fire")
	_, err := hold.Wait(ctx)
	require.NoError(t, err)

	startOnThread(t, p, second, "support-42", "is it out now?")
	require.Eventually(t, func() bool {
		return len(find(p.Events(t, second), event.SubstepStarted, "ask")) == 1
	}, time.Minute, 20*time.Millisecond, "the second run's step shows it waits for the thread")
	require.Empty(t, p.LLM.CallsWithKey(key(second, "ask", 1)), "it has not called the model while the first holds the thread")
	client := runs.New(p.Store)
	v, err := client.Thread(ctx, "support-42")
	require.NoError(t, err)
	require.Empty(t, v.Turns)
	require.Equal(t, []event.Hold{{RunID: first, StepID: "ask", Seq: 1}}, v.Holds)

	hold.Release()
	require.Equal(t, event.RunSucceeded, p.WaitEnd(t, first).Kind)
	require.Equal(t, event.RunSucceeded, p.WaitEnd(t, second).Kind)

	calls := p.LLM.CallsWithKey(key(second, "ask", 1))
	require.Len(t, calls, 1)
	require.Equal(t, []provider.Message{
		{Role: "user", Content: "my printer is on fire"},
		{Role: "assistant", Content: "echo: my printer is on fire"},
		{Role: "user", Content: "is it out now?"},
	}, calls[0].Messages, "the second run's request carries the first run's turns, then its own prompt")
	firstCalls := p.LLM.CallsWithKey(key(first, "ask", 1))
	require.Len(t, firstCalls, 1)
	require.Equal(t, []provider.Message{{Role: "user", Content: "my printer is on fire"}}, firstCalls[0].Messages)

	done := find(p.Events(t, second), event.SubstepCompleted, "ask")
	require.Len(t, done, 1)
	require.JSONEq(t, `{"thread":"support-42","waited_for":"`+first+`"}`, string(data[event.SubstepCompletedData](t, done[0]).Output))
	require.Empty(t, find(p.Events(t, first), event.SubstepStarted, "ask"), "the first run never waited")

	v, err = client.Thread(ctx, "support-42")
	require.NoError(t, err)
	require.Equal(t, [][3]string{
		{first, "user", "my printer is on fire"},
		{first, "assistant", "echo: my printer is on fire"},
		{second, "user", "is it out now?"},
		{second, "assistant", "echo: is it out now?"},
	}, turnsOf(v))
	require.Empty(t, v.Holds)
	require.Equal(t, uint64(4), v.Seq, "open and turns of each run: four records")
}

// TestThreadKill9MidStepHoldsEachTurnOnce: the worker driving the first
// run is killed with SIGKILL while its thread step's call is held; a
// second run on the thread waits meanwhile. The peer that takes the
// first run over re-sends the call (its open is in the thread already:
// no second open), the second run goes on after it, and the thread holds
// each turn exactly once.
func TestThreadKill9MidStepHoldsEachTurnOnce(t *testing.T) {
	t.Parallel()
	p := setupProc(t, time.Second)
	ctx := ctxFor(t, 2*time.Minute)
	w1 := p.palWorker(t, "w1")
	first, second := event.NewRunID(), event.NewRunID()
	hold := p.LLM.Hold(providertest.ByKey(key(first, "ask", 1)))
	startOnThread(t, p, first, "t-crash", "one")
	_, err := hold.Wait(ctx)
	require.NoError(t, err)
	startOnThread(t, p, second, "t-crash", "two")
	require.Eventually(t, func() bool {
		return len(find(p.Events(t, second), event.SubstepStarted, "ask")) == 1
	}, time.Minute, 20*time.Millisecond, "the second run waits for the thread")

	w1.Kill()
	p.palWorker(t, "w2")
	_, err = hold.Wait(ctx) // the call re-sent by the worker that took the run over
	require.NoError(t, err)
	hold.Release()
	require.Equal(t, event.RunSucceeded, p.WaitEnd(t, first).Kind)
	require.Equal(t, event.RunSucceeded, p.WaitEnd(t, second).Kind)
	require.Equal(t, 2, p.LLM.Keys()[key(first, "ask", 1)], "the call in flight was re-sent with its key")
	require.Equal(t, 1, p.LLM.Keys()[key(second, "ask", 1)])

	v, err := runs.New(p.Store).Thread(ctx, "t-crash")
	require.NoError(t, err)
	require.Equal(t, [][3]string{
		{first, "user", "one"},
		{first, "assistant", "echo: one"},
		{second, "user", "two"},
		{second, "assistant", "echo: two"},
	}, turnsOf(v), "each turn once, the first run's before the second's")
	require.Empty(t, v.Holds)
	require.Equal(t, uint64(4), v.Seq, "one open and one turns record per run: none doubled")
	testenv.ReadJournal(t, p.NC)
}

// TestThreadFullRefusesTheStep: a thread at its bound
// (PAL_THREAD_MAX_TURNS) fails the next thread step at once, naming the
// bound, and the thread keeps what it had.
func TestThreadFullRefusesTheStep(t *testing.T) {
	t.Parallel()
	p := setupProc(t, time.Second)
	ctx := ctxFor(t, 2*time.Minute)
	p.palWorker(t, "w1", "PAL_THREAD_MAX_TURNS=2")
	first, second := event.NewRunID(), event.NewRunID()
	startOnThread(t, p, first, "small", "hello")
	require.Equal(t, event.RunSucceeded, p.WaitEnd(t, first).Kind)
	startOnThread(t, p, second, "small", "again")
	end := p.WaitEnd(t, second)
	require.Equal(t, event.RunFailed, end.Kind)
	failed := find(p.Events(t, second), event.StepFailed, "ask")
	require.Len(t, failed, 1)
	require.Contains(t, data[event.StepFailedData](t, failed[0]).Error, "thread small holds 2 turns, its limit (PAL_THREAD_MAX_TURNS 2)")
	require.Empty(t, p.LLM.CallsWithKey(key(second, "ask", 1)), "no model call on a full thread")
	v, err := runs.New(p.Store).Thread(ctx, "small")
	require.NoError(t, err)
	require.Len(t, v.Turns, 2)
	require.Empty(t, v.Holds)
	_, err = p.Store.ReadThread(ctx, "no-such-thread")
	require.NoError(t, err)
	_, err = runs.New(p.Store).Thread(ctx, "no-such-thread")
	require.ErrorIs(t, err, runs.ErrThreadNotFound)
	_, err = runs.New(p.Store).Thread(ctx, "bad.thread")
	var ie *runs.InputError
	require.ErrorAs(t, err, &ie)
	require.Equal(t, "thread", ie.Field)
}

// TestThreadKill9AfterAStepAppendedKeepsItOnce: a run with two thread
// steps, killed with SIGKILL while the second is in its call: the first
// step's turns are in the thread already, and the drive that takes the
// run over finds them there and does not append them again; the second
// step's request carries the first's turns (the thread within one run),
// and the thread ends with each turn once.
func TestThreadKill9AfterAStepAppendedKeepsItOnce(t *testing.T) {
	t.Parallel()
	p := setupProc(t, time.Second)
	ctx := ctxFor(t, 2*time.Minute)
	wf := `{"name":"two","nodes":[{"id":"start","type":"trigger"},
		{"id":"a","type":"ai-step","data":{"provider":"openai","model":"m","prompt":"first {{input.q}}","thread":true}},
		{"id":"b","type":"ai-step","data":{"provider":"openai","model":"m","prompt":"then {{input.q}}","thread":true}}],
		"edges":[{"from":"start","to":"a"},{"from":"a","to":"b"}]}`
	w1 := p.palWorker(t, "w1")
	runID := event.NewRunID()
	hold := p.LLM.Hold(providertest.ByKey(key(runID, "b", 1)))
	_, err := runs.New(p.Store).Start(ctx, runs.StartCommand{Rights: runs.AllRights, RunID: runID,
		Workflow: json.RawMessage(wf), Input: json.RawMessage(`{"q":"x"}`), Thread: "t-two"})
	require.NoError(t, err)
	_, err = hold.Wait(ctx)
	require.NoError(t, err)
	v, err := runs.New(p.Store).Thread(ctx, "t-two")
	require.NoError(t, err)
	require.Len(t, v.Turns, 2, "step a's turns are in before step b calls")
	w1.Kill()
	p.palWorker(t, "w2")
	_, err = hold.Wait(ctx)
	require.NoError(t, err)
	hold.Release()
	require.Equal(t, event.RunSucceeded, p.WaitEnd(t, runID).Kind)

	v, err = runs.New(p.Store).Thread(ctx, "t-two")
	require.NoError(t, err)
	require.Equal(t, [][3]string{
		{runID, "user", "first x"}, {runID, "assistant", "echo: first x"},
		{runID, "user", "then x"}, {runID, "assistant", "echo: then x"},
	}, turnsOf(v))
	require.Equal(t, uint64(4), v.Seq, "open a, turns a, open b, turns b: nothing doubled")
	for _, c := range p.LLM.CallsWithKey(key(runID, "b", 1)) {
		require.Equal(t, []provider.Message{{Role: "user", Content: "first x"}, {Role: "assistant", Content: "echo: first x"},
			{Role: "user", Content: "then x"}}, c.Messages)
	}
}

// TestThreadAgentAndWindow: an agent with thread: true starts each of its
// turns' requests from the thread and appends its prompt and final
// answer; threadWindow sends only the thread's last N turns.
func TestThreadAgentAndWindow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t, time.Minute)
	b.LLM.SetResponder(func(c providertest.Call) providertest.Reply {
		tools := 0
		for _, m := range c.Messages {
			if m.Role == "tool" {
				tools++
			}
		}
		if len(c.Tools) > 0 && tools == 0 {
			return providertest.Reply{ToolCalls: []provider.ToolCall{{ID: "call_0", Name: "echo", Arguments: json.RawMessage(`{"n":1}`)}}}
		}
		return providertest.Reply{Text: "echo: " + c.LastUser()}
	})
	b.worker(t, "w1", nil)
	start := func(wf, q string) string {
		t.Helper()
		runID := event.NewRunID()
		_, err := b.Runs.Start(ctx, runs.StartCommand{Rights: runs.AllRights, RunID: runID, Workflow: json.RawMessage(wf),
			Input: json.RawMessage(`{"q":"` + q + `"}`), Thread: "t-agent"})
		require.NoError(t, err)
		require.Equal(t, event.RunSucceeded, b.WaitEnd(t, runID).Kind)
		return runID
	}
	first := start(threadWorkflow, "one")
	agent := `{"name":"agent","nodes":[{"id":"start","type":"trigger"},
		{"id":"ask","type":"agent","data":{"provider":"openai","model":"m","prompt":"{{input.q}}","tools":[{"name":"echo"}],"thread":true}}],
		"edges":[{"from":"start","to":"ask"}]}`
	second := start(agent, "two")
	turns := func(runID string) [][]provider.Message {
		var out [][]provider.Message
		for _, k := range []string{"ask.turn[0]", "ask.turn[1]"} {
			for _, c := range b.LLM.CallsWithKey(key(runID, k, 1)) {
				out = append(out, c.Messages)
			}
		}
		return out
	}
	got := turns(second)
	require.Len(t, got, 2)
	prior := []provider.Message{{Role: "user", Content: "one"}, {Role: "assistant", Content: "echo: one"}}
	require.Equal(t, prior, got[0][:2], "the agent's first turn starts from the thread")
	require.Equal(t, provider.Message{Role: "user", Content: "two"}, got[0][2])
	require.Equal(t, prior, got[1][:2], "and so does its next turn")
	require.Len(t, got[1], 5, "thread (2), prompt, the tool call, its result")

	windowed := `{"name":"win","nodes":[{"id":"start","type":"trigger"},
		{"id":"ask","type":"ai-step","data":{"provider":"openai","model":"m","prompt":"{{input.q}}","thread":true,"threadWindow":2}}],
		"edges":[{"from":"start","to":"ask"}]}`
	third := start(windowed, "three")
	calls := b.LLM.CallsWithKey(key(third, "ask", 1))
	require.Len(t, calls, 1)
	require.Equal(t, []provider.Message{{Role: "user", Content: "two"}, {Role: "assistant", Content: "echo: two"},
		{Role: "user", Content: "three"}}, calls[0].Messages, "the last two turns of the thread, then the step's prompt")

	v, err := b.Runs.Thread(ctx, "t-agent")
	require.NoError(t, err)
	var runsOf []string
	for _, tr := range v.Turns {
		runsOf = append(runsOf, tr.RunID)
	}
	require.Equal(t, []string{first, first, second, second, third, third}, runsOf, "the agent's prompt and final answer, once")
	require.Equal(t, "ask", v.Turns[2].StepID)
	require.Equal(t, "echo: two", v.Turns[3].Content)
}

// TestThreadTurnsAfterACrashBetweenCompletionAndAppend: a worker died
// after its thread step's step_completed was durable and before the
// step's turns reached the thread (the journal and the thread as it left
// them). The next drive appends the turns, once, from the journal; the
// model is not called again; the run ends with the thread released.
func TestThreadTurnsAfterACrashBetweenCompletionAndAppend(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t, time.Minute)
	runID := event.NewRunID()
	_, err := b.Runs.Start(ctx, runs.StartCommand{Rights: runs.AllRights, RunID: runID, Workflow: json.RawMessage(threadWorkflow),
		Input: json.RawMessage(`{"q":"hello"}`), Thread: "t-gap"})
	require.NoError(t, err)
	th, err := b.Store.ReadThread(ctx, "t-gap")
	require.NoError(t, err)
	_, err = b.Store.AppendThread(ctx, th, event.ThreadRecord{Kind: event.ThreadOpen, RunID: runID, StepID: "ask"}, eventstore.ThreadLimits{})
	require.NoError(t, err)
	appendRaw(t, b, runID,
		event.MustNew(event.RunResumed, "", 0, event.RunResumedData{Worker: "crashed-worker", ResumeCount: 1}),
		event.MustNew(event.StepStarted, "ask", 1, event.StepStartedData{NodeID: "ask", NodeType: "ai-step",
			Input: json.RawMessage(`{"provider":"openai","model":"m","messages":[{"role":"user","content":"hello"}]}`), IdempotencyKey: key(runID, "ask", 1)}),
		event.MustNew(event.StepCompleted, "ask", 1, event.StepCompletedData{Output: json.RawMessage(`{"text":"hi there","model":"m"}`)}))

	b.worker(t, "w1", nil)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, runID).Kind)
	require.Empty(t, b.LLM.Calls(), "the completed step was not called again")
	v, err := b.Runs.Thread(ctx, "t-gap")
	require.NoError(t, err)
	require.Equal(t, [][3]string{{runID, "user", "hello"}, {runID, "assistant", "hi there"}}, turnsOf(v))
	require.Empty(t, v.Holds)
	require.Equal(t, uint64(2), v.Seq, "the open and the turns, once")
}
