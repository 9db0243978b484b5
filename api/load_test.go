package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/api"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/internal/limit"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/runs"
)

// loadConfig shapes a load run against the REST API on loopback: watchers
// follow one run over SSE while start requests arrive at a fixed rate.
type loadConfig struct {
	watchers int
	starts   int // start requests in all
	rate     int // start requests per second (open loop)
	// steps of the watched run; its journal has 2*steps+3 events, appended
	// one every stepEvery.
	steps     int
	stepEvery time.Duration
}

type loadResult struct {
	// startLat is each start request's latency, counted from when it was
	// due (so a load generator that falls behind shows as latency).
	startLat []time.Duration
	// delivery is, per event and watcher, append time to arrival.
	delivery   []time.Duration
	startPhase time.Duration
	events     int
}

func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(p * float64(len(s)-1))
	return s[i]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// runLoad runs the load and fails tb on any error or lost event. Nothing
// drives the started runs (no worker): it measures the API, not the
// workers. The watched run's journal is written by the test itself, at a
// steady pace, so delivery latency is measured on live events.
func runLoad(tb testing.TB, cfg loadConfig) loadResult {
	// One token starts them all, at the rate asked for: it measures the
	// API, not its limits.
	lim := limit.Defaults()
	lim.Starts = limit.Rate{}
	b := setup(tb, withHandler(func(hc *api.HandlerConfig) { hc.Limiter = limit.New(lim, nil) }))
	ctx := context.Background()
	const runID = "run_watched"
	wf := paltest.Chain("watched", cfg.steps, func(i int, _ string) (string, string) {
		id := fmt.Sprintf("t%d", i)
		return id, fmt.Sprintf(`{"id":%q,"type":"tool","data":{"tool":"echo"}}`, id)
	})
	_, err := runs.New(b.Store).Start(ctx, runs.StartCommand{Rights: runs.AllRights, RunID: runID, Workflow: json.RawMessage(wf)})
	require.NoError(tb, err)
	total := 2*cfg.steps + 3

	// Watchers: each connects, gets run_created, then follows live.
	sseClient := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: cfg.watchers}}
	defer sseClient.CloseIdleConnections()
	var (
		connected, watchersDone sync.WaitGroup
		mu                      sync.Mutex
		res                     loadResult
		watchErrs               []string
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		watchErrs = append(watchErrs, fmt.Sprintf(format, args...))
	}
	connected.Add(cfg.watchers)
	watchersDone.Add(cfg.watchers)
	for w := range cfg.watchers {
		go func() {
			defer watchersDone.Done()
			s, err := b.openSSE(tb, sseClient, runID, "")
			if err != nil {
				connected.Done()
				fail("watcher %d: connecting: %v", w, err)
				return
			}
			defer s.close()
			var lat []time.Duration
			var seqs []uint64
			first := true
			for {
				ev, err := s.next()
				if first {
					connected.Done()
					first = false
				}
				if err == io.EOF {
					break
				}
				if err != nil {
					fail("watcher %d: after seq %v: %v", w, seqs, err)
					return
				}
				if ev.id > 1 {
					lat = append(lat, time.Since(ev.event.TS))
				}
				seqs = append(seqs, ev.id)
			}
			want := make([]uint64, total)
			for i := range want {
				want[i] = uint64(i + 1)
			}
			if !slices.Equal(seqs, want) {
				fail("watcher %d: got seqs %v, want 1..%d exactly once", w, seqs, total)
			}
			mu.Lock()
			res.delivery = append(res.delivery, lat...)
			mu.Unlock()
		}()
	}
	connected.Wait()
	// All the watchers share one journal watch, which takes no consumer
	// on PAL_EVENTS (eventstore.Watch).
	events, err := b.JS.Stream(ctx, eventstore.EventsStream)
	require.NoError(tb, err)
	info, err := events.Info(ctx)
	require.NoError(tb, err)
	require.Zero(tb, info.State.Consumers, "%d watchers of one run took a consumer", cfg.watchers)

	// The watched run's journal, appended at a steady pace.
	driverDone := make(chan error, 1)
	go func() {
		driverDone <- func() error {
			head, err := b.Store.LastHead(ctx, runID)
			if err != nil {
				return err
			}
			appendOne := func(ev event.Event) error {
				time.Sleep(cfg.stepEvery)
				ev.WorkerID = "load-driver"
				head, err = b.Store.Append(ctx, runID, head, ev)
				return err
			}
			if err := appendOne(event.MustNew(event.RunResumed, "", 0, event.RunResumedData{Worker: "load-driver", ResumeCount: 1})); err != nil {
				return err
			}
			for i := 1; i <= cfg.steps; i++ {
				step := fmt.Sprintf("t%d", i)
				if err := appendOne(event.MustNew(event.StepStarted, step, 1, event.StepStartedData{NodeID: step, NodeType: "tool",
					Input: json.RawMessage(`{}`), IdempotencyKey: event.IdempotencyKey(runID, step, 1)})); err != nil {
					return err
				}
				if err := appendOne(event.MustNew(event.StepCompleted, step, 1, event.StepCompletedData{Output: json.RawMessage(`{}`)})); err != nil {
					return err
				}
			}
			return appendOne(event.MustNew(event.RunSucceeded, "", 0, event.RunSucceededData{Output: json.RawMessage(`{}`)}))
		}()
	}()

	// Start requests, open loop at the given rate, at most 256 in flight.
	startClient := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}, Timeout: 30 * time.Second}
	defer startClient.CloseIdleConnections()
	body := []byte(`{"workflow":` + echoWorkflow + `,"input":{"load":true}}`)
	var (
		startsDone sync.WaitGroup
		startErrs  []string
		lat        = make([]time.Duration, cfg.starts)
	)
	sem := make(chan struct{}, 256)
	interval := time.Second / time.Duration(cfg.rate)
	begin := time.Now()
	for i := range cfg.starts {
		due := begin.Add(time.Duration(i) * interval)
		if d := time.Until(due); d > 0 {
			time.Sleep(d)
		}
		sem <- struct{}{}
		startsDone.Add(1)
		go func() {
			defer func() { <-sem; startsDone.Done() }()
			req, _ := http.NewRequest(http.MethodPost, b.url+"/v1/runs", strings.NewReader(string(body)))
			req.Header.Set("Authorization", "Bearer "+testToken)
			r, err := startClient.Do(req)
			if err != nil {
				mu.Lock()
				startErrs = append(startErrs, err.Error())
				mu.Unlock()
				return
			}
			data, _ := io.ReadAll(r.Body)
			r.Body.Close()
			lat[i] = time.Since(due)
			if r.StatusCode != http.StatusCreated {
				mu.Lock()
				startErrs = append(startErrs, fmt.Sprintf("%d %s", r.StatusCode, data))
				mu.Unlock()
			}
		}()
	}
	startsDone.Wait()
	res.startPhase = time.Since(begin)
	res.startLat = lat

	select {
	case err := <-driverDone:
		require.NoError(tb, err)
	case <-time.After(2 * time.Minute):
		tb.Fatal("the watched run's journal was not written in time")
	}
	wdone := make(chan struct{})
	go func() { watchersDone.Wait(); close(wdone) }()
	select {
	case <-wdone:
	case <-time.After(time.Minute):
		tb.Fatal("watchers did not see the end of the run")
	}
	require.Empty(tb, startErrs, "start requests failed")
	require.Empty(tb, watchErrs, "watchers lost events")
	res.events = total

	// Every start created its run.
	si, err := events.Info(ctx, jetstream.WithSubjectFilter(eventstore.EventsPrefix+"*"))
	require.NoError(tb, err)
	require.Len(tb, si.State.Subjects, cfg.starts+1, "one journal per start, plus the watched run")
	return res
}

// TestLoad is the load at reduced scale: 200 SSE watchers of one run and
// 300 start requests at 1,000/s, on loopback. No errors, no lost events.
func TestLoad(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("load test skipped in -short mode")
	}
	res := runLoad(t, loadConfig{watchers: 200, starts: 300, rate: 1000, steps: 20, stepEvery: 10 * time.Millisecond})
	t.Logf("%d starts in %s (%.0f/s): latency p50 %.2fms p99 %.2fms; %d events × %d watchers: delivery p50 %.2fms p99 %.2fms",
		len(res.startLat), res.startPhase.Round(time.Millisecond), float64(len(res.startLat))/res.startPhase.Seconds(),
		ms(percentile(res.startLat, 0.5)), ms(percentile(res.startLat, 0.99)), res.events, 200,
		ms(percentile(res.delivery, 0.5)), ms(percentile(res.delivery, 0.99)))
}

// BenchmarkLoad is the load at full scale: 200 SSE watchers of one run
// (203 events over ~10 s) while start requests arrive at 1,000/s for 10 s,
// on loopback. Run it with
//
//	go test -run '^$' -bench BenchmarkLoad -benchtime 1x ./api/
func BenchmarkLoad(b *testing.B) {
	for b.Loop() {
		res := runLoad(b, loadConfig{watchers: 200, starts: 10_000, rate: 1000, steps: 100, stepEvery: 50 * time.Millisecond})
		b.ReportMetric(float64(len(res.startLat))/res.startPhase.Seconds(), "starts/s")
		b.ReportMetric(ms(percentile(res.startLat, 0.5)), "start-p50-ms")
		b.ReportMetric(ms(percentile(res.startLat, 0.99)), "start-p99-ms")
		b.ReportMetric(ms(percentile(res.delivery, 0.5)), "deliver-p50-ms")
		b.ReportMetric(ms(percentile(res.delivery, 0.99)), "deliver-p99-ms")
	}
}
