package workers_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/provider/providertest"
	"github.com/palrun/pal/workers"
)

func TestStopHandsRunsToAnotherWorkerAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, paltest.LeaseTTL(30*time.Second))
	hold := b.LLM.Hold(func(c providertest.Call) bool { return strings.Contains(c.LastUser(), "step 2") })
	w1 := b.worker(t, "w1", nil)
	runID := b.Start(t, seqWorkflow(3, "openai"), `{"topic":"x"}`)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := hold.Wait(ctx)
	require.NoError(t, err)
	// With a 30 s lease, only a hand-off lets w2 resume quickly.
	require.NoError(t, w1.Stop(ctx))
	hold.Release()
	b.worker(t, "w2", nil)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, runID).Kind)
	evs := b.Events(t, runID)
	resumes := find(evs, event.RunResumed, "")
	require.Len(t, resumes, 2)
	require.Equal(t, "w2", data[event.RunResumedData](t, resumes[1]).Worker)
	require.Less(t, resumes[1].TS.Sub(resumes[0].TS), 20*time.Second, "w2 did not wait for the lease to expire")
	for _, ev := range evs[len(evs)-4:] {
		require.Equal(t, "w2", ev.WorkerID)
	}
}

func TestLostLeaseStopsTheDrive(t *testing.T) {
	t.Parallel()
	b := setup(t)
	hold := b.LLM.Hold(func(c providertest.Call) bool { return strings.Contains(c.LastUser(), "step 2") })
	logs := b.captureLogs(t)
	b.worker(t, "w1", nil)
	runID := b.Start(t, seqWorkflow(3, "openai"), `{"topic":"x"}`)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := hold.Wait(ctx)
	require.NoError(t, err)
	before := b.Events(t, runID)
	// Someone else takes the lease (as after an expiry): w1 must stop at
	// once, cancel its call and append nothing more.
	kv, err := b.JS.KeyValue(ctx, eventstore.LeaseBucket)
	require.NoError(t, err)
	require.NoError(t, kv.Purge(ctx, runID))
	_, err = kv.Create(ctx, runID, []byte("thief"), jetstream.KeyTTL(time.Minute)) // a lease as PAL writes one: with a TTL
	require.NoError(t, err)
	logs.Wait(t, "drive interrupted")
	require.Contains(t, logs.String(), "lease lost")
	hold.Release()
	require.Never(t, func() bool { return len(b.Events(t, runID)) != len(before) }, time.Second, 50*time.Millisecond)
	require.NoError(t, kv.Purge(ctx, runID))
}

// TestFirstDriveActsOnlyWithTheLease: a fresh run's first drive takes the
// lease while it reads the journal and flushes its run_resumed, so the
// token may land before the lease is known. Here another owner holds the
// lease: the drive lands its token and acts on nothing, and the run's
// step runs once, when the lease is free and the work comes back.
func TestFirstDriveActsOnlyWithTheLease(t *testing.T) {
	t.Parallel()
	b := setup(t, paltest.LeaseTTL(time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	runID := b.Start(t, echoChain(1), `{}`)
	kv, err := b.JS.KeyValue(ctx, eventstore.LeaseBucket)
	require.NoError(t, err)
	_, err = kv.Create(ctx, runID, []byte("other/00000000"), jetstream.KeyTTL(time.Minute)) // a lease as PAL writes one: with a TTL
	require.NoError(t, err)

	var calls atomic.Int32
	logs := b.captureLogs(t)
	b.worker(t, "w1", map[string]workers.Tool{"echo": func(_ context.Context, in json.RawMessage) (json.RawMessage, error) {
		calls.Add(1)
		return in, nil
	}})
	logs.Wait(t, "run is leased by another worker")
	require.Never(t, func() bool { return calls.Load() != 0 }, 500*time.Millisecond, 20*time.Millisecond,
		"a drive without the lease ran the step")
	require.Equal(t, event.RunResumed, find(b.Events(t, runID), event.RunResumed, "")[0].Kind,
		"the token went out while the lease was being taken")

	require.NoError(t, kv.Purge(ctx, runID))
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, runID).Kind)
	require.Equal(t, int32(1), calls.Load())
	resumed := find(b.Events(t, runID), event.RunResumed, "")
	require.Len(t, resumed, 2)
	require.True(t, data[event.RunResumedData](t, resumed[1]).Crashed, "the first drive began and did not finish")
}

// TestAppendBeforeRunResumedResumesAgain: a drive's run_resumed goes with
// its first step's step_started, in strict mode as one message. When the
// journal moved between the drive's read and that flush — here a crashed
// worker's drive landed its events meanwhile — the drive, which holds the
// lease, reads the journal again and resumes from there, in the same
// drive: the step the other worker completed is not run again.
func TestAppendBeforeRunResumedResumesAgain(t *testing.T) {
	t.Parallel()
	b := setup(t, paltest.Strict())
	var calls atomic.Int32
	w := b.worker(t, "w1", map[string]workers.Tool{"echo": func(_ context.Context, in json.RawMessage) (json.RawMessage, error) {
		calls.Add(1)
		return in, nil
	}})
	entered, ready := make(chan struct{}), make(chan struct{})
	var drives atomic.Int32
	workers.SetBeforeDrive(w, func(string) {
		if drives.Add(1) == 1 {
			close(entered)
			<-ready
		}
	})
	runID := b.Start(t, echoChain(2), `{}`)
	<-entered
	time.Sleep(50 * time.Millisecond) // the drive's own read of the journal is done
	appendRaw(t, b, runID,
		event.MustNew(event.RunResumed, "", 0, event.RunResumedData{Worker: "crashed-worker", ResumeCount: 1}),
		event.MustNew(event.StepStarted, "t1", 1, event.StepStartedData{NodeID: "t1", NodeType: "tool",
			Input: json.RawMessage(`{"i":1}`), IdempotencyKey: key(runID, "t1", 1)}),
		event.MustNew(event.StepCompleted, "t1", 1, event.StepCompletedData{Output: json.RawMessage(`{"i":1}`)}))
	close(ready)

	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, runID).Kind)
	require.Equal(t, int32(1), calls.Load(), "only t2 ran on w1")
	require.Equal(t, int32(1), drives.Load(), "one drive did it all: the conflict did not end it")
	evs := b.Events(t, runID)
	resumed := find(evs, event.RunResumed, "")
	require.Len(t, resumed, 2)
	require.Equal(t, "w1", resumed[1].WorkerID)
	require.True(t, data[event.RunResumedData](t, resumed[1]).Crashed)
	require.Len(t, find(evs, event.StepStarted, "t1"), 1)
	require.Greater(t, resumed[1].Seq, find(evs, event.StepCompleted, "t1")[0].Seq)

	// The messages on the run's subject, by their kinds.
	cons, err := b.JS.OrderedConsumer(context.Background(), eventstore.EventsStream,
		jetstream.OrderedConsumerConfig{FilterSubjects: []string{eventstore.EventsSubject(runID)}})
	require.NoError(t, err)
	var kinds []string
	var last uint64
	for range 4 {
		m, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		require.NoError(t, err)
		kinds = append(kinds, m.Headers().Get("Pal-Kind"))
		md, err := m.Metadata()
		require.NoError(t, err)
		last = md.Sequence.Stream
	}
	require.Equal(t, []string{"run_created", "run_resumed,step_started,step_completed",
		"run_resumed,step_started", "step_completed,run_succeeded"}, kinds)
	stream, err := b.JS.Stream(context.Background(), eventstore.EventsStream)
	require.NoError(t, err)
	end, err := stream.GetLastMsgForSubject(context.Background(), eventstore.EventsSubject(runID))
	require.NoError(t, err)
	require.Equal(t, last, end.Sequence, "no message after run_succeeded's")
}
