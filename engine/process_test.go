package engine_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/workflow"
)

const processWF = `{"name":"p","nodes":[{"id":"start","type":"trigger"},
	{"id":"work","type":"process","data":{"command":["agent","--topic","{{input.topic}}"],
	 "env":{"TOPIC":"{{input.topic}}"},"input":{"t":"{{input.topic}}"},"maxResumes":2,
	 "limits":{"memoryMb":64}}}],
	"edges":[{"from":"start","to":"work"}]}`

// TestProcessStepResumesThenExhausts: every drive that finds the process
// step running counts a resume; one past maxResumes fails the run.
func TestProcessStepResumesThenExhausts(t *testing.T) {
	t.Parallel()
	h := newHistory(t, "run_p", processWF, `{"topic":"x"}`).resume("w1").start("work")
	p := h.plan("work")
	require.Equal(t, engine.ExecProcess, p.Exec)
	require.Zero(t, p.Resumes)
	var in engine.ProcessInput
	require.NoError(t, json.Unmarshal(p.Input, &in))
	require.Equal(t, []string{"agent", "--topic", "x"}, in.Command)
	require.Equal(t, map[string]string{"TOPIC": "x"}, in.Env)
	require.JSONEq(t, `{"t":"x"}`, string(in.Stdin))
	require.Equal(t, 64, in.Limits.MemoryMb)

	h.append(event.SubstepStarted, "work", 1, event.SubstepStartedData{Name: "a"})
	h.append(event.SubstepCompleted, "work", 1, event.SubstepCompletedData{Name: "a", Output: json.RawMessage(`1`)})
	h.append(event.SubstepStarted, "work", 1, event.SubstepStartedData{Name: "b"})
	for i := 1; i <= 2; i++ {
		h.resume("w2")
		p = h.plan("work")
		require.True(t, p.Started)
		require.Equal(t, i, p.Resumes)
	}
	a := h.st.Steps["work"].AttemptState(1)
	require.Equal(t, []engine.Substep{{Name: "a", Status: engine.StepCompleted, Output: json.RawMessage(`1`)},
		{Name: "b", Status: engine.StepRunning}}, a.Substeps)
	// A second completion of a keeps the first output.
	h.append(event.SubstepCompleted, "work", 1, event.SubstepCompletedData{Name: "a", Output: json.RawMessage(`2`)})
	require.JSONEq(t, `1`, string(a.Substep("a").Output))

	h.resume("w3")
	f, ok := engine.Next(h.st.Workflow, h.st, h.now).(engine.Fail)
	require.True(t, ok)
	require.Equal(t, event.CodeProcessResumeExhausted, f.Code)
	require.Equal(t, 3, f.Attempts)
	require.Equal(t, "work", f.StepID)
}

// TestProcessStepCompletedIsNotResumed: a drive after the step completed
// does not count against it.
func TestProcessStepCompletedIsNotResumed(t *testing.T) {
	t.Parallel()
	h := newHistory(t, "run_q", processWF, `{"topic":"x"}`).resume("w1").start("work").complete("work", `{"ok":true}`, nil)
	h.resume("w2")
	require.Zero(t, h.st.Steps["work"].Resumes)
	_, done := engine.Next(h.st.Workflow, h.st, h.now).(engine.Complete)
	require.True(t, done)
}

// TestProcessInputRendersDataAsArguments: each value from the input is one
// argument, whatever it holds; the environment's names and the program are
// checked again as the step is rendered, for a node no validation saw.
func TestProcessInputRendersDataAsArguments(t *testing.T) {
	t.Parallel()
	node := &workflow.Node{ID: "work", Type: workflow.TypeProcess, Data: json.RawMessage(
		`{"command":["/bin/echo","{{input.a}}","x{{input.b}}"],"env":{"NAME":"{{input.a}}"},"network":"egress"}`)}
	in := workflow.Env{Input: map[string]any{"a": "world; head -c 6 data/nats-worker.nk", "b": "$(id) `id` | sh"}}
	raw, err := engine.RenderInput(node, in)
	require.NoError(t, err)
	var p engine.ProcessInput
	require.NoError(t, json.Unmarshal(raw, &p))
	require.Equal(t, []string{"/bin/echo", "world; head -c 6 data/nats-worker.nk", "x$(id) `id` | sh"}, p.Command)
	require.Equal(t, map[string]string{"NAME": "world; head -c 6 data/nats-worker.nk"}, p.Env)
	require.Equal(t, workflow.NetworkEgress, p.Network)

	for data, want := range map[string]string{
		`{"command":["{{input.a}}"]}`:                          "command[0]: the program is part of the definition",
		`{"command":["x"],"env":{"LD_PRELOAD":"/tmp/x.so"}}`:   "env.LD_PRELOAD",
		`{"command":["x"],"env":{"PATH":"{{input.a}}"}}`:       "env.PATH",
		`{"command":["x"],"env":{"PYTHONPATH":"{{input.a}}"}}`: "set it to a constant",
	} {
		_, err := engine.RenderInput(&workflow.Node{ID: "work", Type: workflow.TypeProcess, Data: json.RawMessage(data)}, in)
		require.ErrorContains(t, err, want, data)
	}
}
