package api_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/api"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/internal/limit"
	"github.com/palrun/pal/runs"
)

// The helper process of TestSSEWatchers reads these (test-only
// variables, not settings).
const (
	watchersEnv    = "PAL_TEST_SSE_WATCHERS" // how many streams (default 1,000)
	watchClientURL = "PAL_TEST_SSE_CLIENT_URL"
)

// watchGate parks each run on an approval after one step, so the streams
// are open on live runs, and the approval makes the rest flow.
const watchGate = `{"name":"watched","nodes":[{"id":"start","type":"trigger"},
	{"id":"t1","type":"tool","data":{"tool":"echo","input":{"i":1}}},
	{"id":"gate","type":"approval","data":{}},
	{"id":"t2","type":"tool","data":{"tool":"echo","input":{"i":2}}},
	{"id":"t3","type":"tool","data":{"tool":"echo","input":{"i":3}}}],
	"edges":[{"from":"start","to":"t1"},{"from":"t1","to":"gate"},{"from":"gate","to":"t2"},{"from":"t2","to":"t3"}]}`

// watchResult is what the helper process reports of one stream.
type watchResult struct {
	Run    string `json:"run"`
	Events int    `json:"events"`
	// Last is the seq of the last event; Ordered says seqs went 1, 2, …
	// with none missing or repeated.
	Last     uint64 `json:"last"`
	Ordered  bool   `json:"ordered"`
	Terminal bool   `json:"terminal"`
	Err      string `json:"err,omitempty"`
}

// TestSSEWatchers opens PAL_TEST_SSE_WATCHERS (default 1,000; make bench
// runs the target, 10,000) concurrent GET /v1/runs/{id}/events
// streams, 100 per run, against one API server, from a helper process (a
// process of this test binary, so each side stays within its file limit
// and the server's memory is measured alone). While they are open, no
// consumer is created on PAL_EVENTS and the server's memory per stream is
// bounded; then the runs are approved and every stream must receive every
// event of its run, in order, up to the terminal one.
func TestSSEWatchers(t *testing.T) {
	n := 1000
	if v := os.Getenv(watchersEnv); v != "" {
		var err error
		n, err = strconv.Atoi(v)
		require.NoError(t, err, watchersEnv)
	}
	const perRun = 100
	nRuns := max(1, n/perRun)
	ctx := context.Background()
	// One token opens them all, at once: its limits allow that many.
	lim := limit.Defaults()
	lim.OpenStreams, lim.Streams = n, limit.Rate{N: n, Per: time.Second, Burst: n}
	b := setup(t, withWorker(), withKeepAlive(time.Minute), withHandler(func(hc *api.HandlerConfig) { hc.Limiter = limit.New(lim, nil) }))

	ids := make([]string, nRuns)
	for i := range ids {
		ids[i] = b.Start(t, watchGate, `{}`)
	}
	for _, id := range ids {
		b.WaitFor(t, id, "the approval wait", func(ev event.Event) bool { return ev.Kind == event.StepWaiting })
	}
	streams := make([]string, n)
	for i := range streams {
		streams[i] = ids[i%nRuns]
	}
	before := serverMemory()

	child := exec.Command(os.Args[0], "-test.run=^TestSSEWatchersClient$", "-test.count=1")
	child.Env = append(os.Environ(), watchClientURL+"="+b.url)
	child.Stdin = strings.NewReader(strings.Join(streams, "\n")) // too long for the environment
	child.Stderr = os.Stderr
	out, err := child.StdoutPipe()
	require.NoError(t, err)
	start := time.Now()
	require.NoError(t, child.Start())
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	lines := bufio.NewScanner(out)
	lines.Buffer(make([]byte, 0, 1<<20), 64<<20)
	next := func(prefix string) string {
		t.Helper()
		for lines.Scan() {
			if rest, ok := strings.CutPrefix(lines.Text(), prefix); ok {
				return rest
			}
		}
		t.Fatalf("the helper process ended before %q: %v", prefix, lines.Err())
		return ""
	}

	next("open ")
	opened := time.Since(start)
	after := serverMemory()
	perStream := (int64(after.bytes) - int64(before.bytes)) / int64(n)
	es, err := b.JS.Stream(ctx, eventstore.EventsStream)
	require.NoError(t, err)
	info, err := es.Info(ctx)
	require.NoError(t, err)
	t.Logf("%d streams over %d runs open in %v; server: +%d goroutines, %d B heap+stack per stream; PAL_EVENTS consumers %d",
		n, nRuns, opened.Round(time.Millisecond), after.goroutines-before.goroutines, perStream, info.State.Consumers)
	require.Zero(t, info.State.Consumers, "watches share one subscription: no consumer per stream or per run")
	// 40 KiB measured (two goroutines, the connection's buffers, the
	// subscription); 125 KiB when each subscription buffered events by value.
	require.Less(t, perStream, int64(64<<10), "server memory per open stream")

	for _, id := range ids {
		require.NoError(t, b.Runs.Approve(ctx, runs.ApproveCommand{RunID: id, StepID: "gate", Decision: "approve", Approver: "ci"}))
	}
	var results []watchResult
	require.NoError(t, json.Unmarshal([]byte(next("done ")), &results))
	t.Logf("every stream at its run's end %v after the approvals", time.Since(start)-opened)
	require.NoError(t, child.Wait())
	require.Len(t, results, n)
	want := map[string]int{}
	for _, id := range ids {
		want[id] = len(b.Events(t, id))
	}
	for i, r := range results {
		require.Empty(t, r.Err, "stream %d", i)
		require.Equal(t, streams[i], r.Run, "stream %d", i)
		require.True(t, r.Ordered, "stream %d of run %s: seqs out of order", i, r.Run)
		require.True(t, r.Terminal, "stream %d of run %s ended without the terminal event", i, r.Run)
		require.Equal(t, want[r.Run], r.Events, "stream %d of run %s", i, r.Run)
	}
}

type memory struct {
	bytes      uint64
	goroutines int
}

// serverMemory is the live heap and the goroutine stacks after a GC.
func serverMemory() memory {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return memory{bytes: ms.HeapAlloc + ms.StackInuse, goroutines: runtime.NumGoroutine()}
}

// TestSSEWatchersClient is TestSSEWatchers' helper process: it opens a
// stream per run id on its standard input (one a line), prints "open" once each has read its backlog
// (the events up to the approval wait), then "done" and a JSON array of
// watchResult once each has ended.
func TestSSEWatchersClient(t *testing.T) {
	url := os.Getenv(watchClientURL)
	if url == "" {
		t.Skip("the helper process of TestSSEWatchers")
	}
	in, err := io.ReadAll(os.Stdin)
	require.NoError(t, err)
	ids := strings.Split(string(in), "\n")
	tr := &http.Transport{MaxIdleConnsPerHost: -1, DisableCompression: true}
	client := &http.Client{Transport: tr}
	results := make([]watchResult, len(ids))
	var opened, ended sync.WaitGroup
	opened.Add(len(ids))
	ended.Add(len(ids))
	dial := make(chan struct{}, 256) // connects at once, within the accept backlog
	for i, id := range ids {
		go func() {
			defer ended.Done()
			results[i] = watchOne(client, url, id, dial, opened.Done)
		}()
	}
	opened.Wait()
	fmt.Println("open", len(ids))
	ended.Wait()
	out, err := json.Marshal(results)
	require.NoError(t, err)
	fmt.Printf("done %s\n", out)
}

// watchOne reads one stream to its end; isOpen is called once, when the
// stream has read its backlog or failed.
func watchOne(client *http.Client, url, id string, dial chan struct{}, isOpen func()) watchResult {
	r := watchResult{Run: id, Ordered: true}
	var once sync.Once
	open := func() { once.Do(func() { <-dial; isOpen() }) }
	defer open()
	dial <- struct{}{}
	req, err := http.NewRequest(http.MethodGet, url+"/v1/runs/"+id+"/events", nil)
	if err != nil {
		r.Err = err.Error()
		return r
	}
	req.Header.Set("Authorization", "Bearer "+testToken)
	res, err := client.Do(req)
	if err != nil {
		r.Err = err.Error()
		return r
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		r.Err = res.Status
		return r
	}
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var ev event.Event
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			r.Err = err.Error()
			return r
		}
		r.Events++
		if ev.Seq != r.Last+1 {
			r.Ordered = false
		}
		r.Last = ev.Seq
		if ev.Kind == event.StepWaiting {
			open()
		}
		if ev.Kind.Terminal() {
			r.Terminal = true
			return r
		}
	}
	if err := sc.Err(); err != nil {
		r.Err = err.Error()
	}
	return r
}
