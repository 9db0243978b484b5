package workers_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
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
