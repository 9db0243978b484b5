package workers_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/paltest/testenv"
	"github.com/palrun/pal/runs"
)

// onQueue puts workflow wf (JSON) on work queue q.
func onQueue(t *testing.T, wf, q string) string {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(wf), &m))
	m["queue"] = q
	out, err := json.Marshal(m)
	require.NoError(t, err)
	return string(out)
}

// palCLI runs one pal command against the bundle's NATS and returns its
// stdout and stderr together.
func (p *procBundle) palCLI(t *testing.T, args ...string) string {
	t.Helper()
	proc := testenv.StartProcess(t, p.bin, args, []string{"PAL_NATS_URL=" + p.natsURL})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, proc.Wait(ctx), "pal %s:\n%s", strings.Join(args, " "), proc.Output())
	return proc.Output()
}

// TestTwoQueues: a run on queue gpu with only a default worker stays
// queued, visibly (pal run get names its queue), while a default run
// beside it completes; once a gpu worker starts it completes, and the
// default worker never drove it. pal workers lists both workers with
// their queues.
func TestTwoQueues(t *testing.T) {
	t.Parallel()
	p := setupProc(t, time.Second)
	ctx := ctxFor(t, 2*time.Minute)
	p.palWorker(t, "wdefault")

	gpu := p.startWithID(t, onQueue(t, echoChain(2), "gpu"), `{}`)
	plain := p.startWithID(t, echoChain(2), `{}`)
	require.Equal(t, event.RunSucceeded, p.WaitEnd(t, plain).Kind)

	// Long after the default run ended, the gpu run has not been touched:
	// its journal is its run_created, and its work waits on its queue.
	time.Sleep(2 * time.Second)
	evs := p.Events(t, gpu)
	require.Len(t, evs, 1, "a default worker touched a gpu run: %v", evs)
	pending, err := p.Store.WorkPending(ctx, "gpu", gpu)
	require.NoError(t, err)
	require.True(t, pending, "the gpu run's work is on its queue")
	view, err := runs.New(p.Store).Get(ctx, gpu)
	require.NoError(t, err)
	require.Equal(t, engine.StatusQueued, view.Status)
	require.Equal(t, "gpu", view.Queue)
	out := p.palCLI(t, "run", "get", gpu)
	require.Contains(t, out, "queued on queue gpu", out)

	p.palWorker(t, "wgpu", "PAL_QUEUES=gpu")
	require.Equal(t, event.RunSucceeded, p.WaitEnd(t, gpu).Kind)
	for _, r := range resumesOf(t, p.Events(t, gpu)) {
		require.Equal(t, "wgpu", r.Worker, "only the gpu worker drives a gpu run")
	}
	for _, r := range resumesOf(t, p.Events(t, plain)) {
		require.Equal(t, "wdefault", r.Worker)
	}

	var listed []struct {
		WorkerID string   `json:"worker_id"`
		Queues   []string `json:"queues"`
		Tools    []string `json:"tools"`
	}
	require.NoError(t, json.Unmarshal([]byte(p.palCLI(t, "workers", "--json")), &listed))
	queues := map[string][]string{}
	for _, w := range listed {
		queues[w.WorkerID] = w.Queues
		require.Contains(t, w.Tools, "echo")
	}
	require.Equal(t, map[string][]string{"wdefault": {"default"}, "wgpu": {"gpu"}}, queues)
}

// TestChildOnAnotherQueue: a subagent node names the gpu queue for its
// child. The parent's default worker never drives the child inline: the
// child waits on gpu, a gpu worker drives it, and its end wakes the
// parent, which completes with the child's output.
func TestChildOnAnotherQueue(t *testing.T) {
	t.Parallel()
	p := setupProc(t, time.Second)
	p.palWorker(t, "wdefault")
	p.palWorker(t, "wgpu", "PAL_QUEUES=gpu")
	child := echoChain(1)
	wf := `{"name":"parent","nodes":[{"id":"start","type":"trigger"},
	  {"id":"sub","type":"subagent","data":{"queue":"gpu","workflow":` + child + `,"input":{"x":1}}}],
	  "edges":[{"from":"start","to":"sub"}]}`
	parent := p.startWithID(t, wf, `{}`)
	end := p.WaitEnd(t, parent)
	require.Equal(t, event.RunSucceeded, end.Kind, "%s", end.Data)
	created := find(p.Events(t, parent), event.ChildRunCreated, "sub")
	require.Len(t, created, 1)
	childID := data[event.ChildRunCreatedData](t, created[0]).ChildRunID
	cevs := p.Events(t, childID)
	require.Equal(t, "gpu", data[event.RunCreatedData](t, cevs[0]).Queue)
	for _, r := range resumesOf(t, cevs) {
		require.Equal(t, "wgpu", r.Worker, "the child is its queue's workers' to drive")
	}
}
