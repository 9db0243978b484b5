package projections_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/projections"
	"github.com/palrun/pal/workers"
)

// gateWorkflow runs an echo step, then waits for an approval.
const gateWorkflow = `{"name":"gate","nodes":[{"id":"start","type":"trigger"},
	{"id":"t1","type":"tool","data":{"tool":"echo","input":{"i":1}}},
	{"id":"gate","type":"approval","data":{}},
	{"id":"t2","type":"tool","data":{"tool":"echo","input":{"i":2}}}],
	"edges":[{"from":"start","to":"t1"},{"from":"t1","to":"gate"},{"from":"gate","to":"t2"}]}`

// lastRaw is the last message on a run's subject, as stored.
func lastRaw(t *testing.T, b *bundle, runID string) *jetstream.RawStreamMsg {
	t.Helper()
	s, err := b.JS.Stream(context.Background(), eventstore.EventsStream)
	require.NoError(t, err)
	m, err := s.GetLastMsgForSubject(context.Background(), eventstore.EventsSubject(runID))
	require.NoError(t, err)
	return m
}

// forge is an envelope as someone who can publish on the subject would
// write it: right prev, the seq and writer given.
func forge(t *testing.T, k event.Kind, runID string, seq uint64, prev, worker string, payload any) []byte {
	t.Helper()
	ev := event.MustNew(k, "t1", 1, payload)
	ev.RunID, ev.Seq, ev.Prev, ev.WorkerID, ev.TS = runID, seq, prev, worker, time.Now().UTC()
	body, err := event.Encode(ev)
	require.NoError(t, err)
	return body
}

// rawKinds counts the kinds on a run's subject, every message that
// decodes included, sound or not.
func rawKinds(t *testing.T, b *bundle, runID string) (kinds map[event.Kind]int, msgs int) {
	t.Helper()
	kinds = map[event.Kind]int{}
	err := b.Store.Scan(context.Background(), runID, 0, 0, func(_ uint64, body []byte) {
		msgs++
		if evs, err := event.Decode(body); err == nil {
			for _, ev := range evs {
				kinds[ev.Kind]++
			}
		}
	})
	require.NoError(t, err)
	return kinds, msgs
}

// TestCorruptJournalFailsTheRun publishes, on the subject of a run parked
// at an approval, each kind of message the journal check refuses. The run
// reads failed (journal_corrupt) from the journal and the projection at
// once; the worker that next takes it seals it with one run_failed, acks
// the work and does not come back; Get answers the failed run.
func TestCorruptJournalFailsTheRun(t *testing.T) {
	t.Parallel()
	b := setup(t, noJournalCheck())
	p := b.projector(t, projections.Config{})
	b.worker(t, "w1")
	ctx := context.Background()
	cases := []struct {
		name   string
		bad    func(runID string, last *jetstream.RawStreamMsg) []byte
		reason string
	}{
		{"not JSON", func(string, *jetstream.RawStreamMsg) []byte { return []byte("not an event") }, "malformed"},
		{"seq gap", func(runID string, last *jetstream.RawStreamMsg) []byte {
			return forge(t, event.StepCompleted, runID, 8, event.Hash(last.Data), "w1", event.StepCompletedData{})
		}, "seq 8 where 7 was due"},
		{"another run's event", func(runID string, last *jetstream.RawStreamMsg) []byte {
			return forge(t, event.StepCompleted, "run_victim_b", 7, event.Hash(last.Data), "w1", event.StepCompletedData{})
		}, `event of run "run_victim_b"`},
		{"forged writer", func(runID string, last *jetstream.RawStreamMsg) []byte {
			return forge(t, event.StepCompleted, runID, 7, event.Hash(last.Data), "mallory",
				event.StepCompletedData{Usage: &event.Usage{CostUSD: 123456.78}})
		}, `step_completed by "mallory", but the run is driven by "w1"`},
		{"byte-flipped copy", func(_ string, last *jetstream.RawStreamMsg) []byte {
			c := append([]byte(nil), last.Data...)
			c[len(c)/2] ^= 0x01
			return c
		}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			runID := b.Start(t, gateWorkflow, `{}`)
			b.WaitFor(t, runID, "the approval wait", func(ev event.Event) bool { return ev.Kind == event.StepWaiting })
			last := lastRaw(t, b, runID)
			_, err := b.JS.Publish(ctx, eventstore.EventsSubject(runID), tc.bad(runID, last))
			require.NoError(t, err)

			// Before any worker looks: every reader shows the run failed.
			v, err := b.Runs.Get(ctx, runID)
			require.NoError(t, err, "Get answers a corrupt journal")
			require.Equal(t, engine.StatusFailed, v.Status)
			require.Equal(t, event.CodeJournalCorrupt, v.ErrorCode)
			require.Contains(t, v.Error, "the journal is corrupt at seq 7")
			require.Contains(t, v.Error, tc.reason)
			caughtUp(t, p)
			d, err := projections.NewReader(b.pool).GetRun(ctx, runID)
			require.NoError(t, err)
			require.Equal(t, engine.StatusFailed, d.Run.Status)
			require.Equal(t, event.CodeJournalCorrupt, d.Run.ErrorCode)
			require.Zero(t, d.Run.CostUSD, "nothing of the bad message is folded")

			// The worker that takes it seals it, once.
			require.NoError(t, b.Store.Enqueue(ctx, "", runID, "test"))
			end := b.WaitEnd(t, runID)
			require.Equal(t, event.RunFailed, end.Kind)
			require.Equal(t, uint64(7), end.Seq)
			require.Equal(t, "w1", end.WorkerID)
			var fd event.RunFailedData
			require.NoError(t, end.DecodeData(&fd))
			require.Equal(t, event.CodeJournalCorrupt, fd.Code)
			require.Equal(t, uint64(7), fd.Seq)
			require.Contains(t, fd.Reason, tc.reason)

			// And never drives it again: over three lease TTLs nothing
			// more lands, and no work is left.
			_, before := rawKinds(t, b, runID)
			require.Never(t, func() bool {
				_, n := rawKinds(t, b, runID)
				return n != before
			}, 3*b.TTL, b.TTL/4)
			kinds, msgs := rawKinds(t, b, runID)
			require.Equal(t, 8, msgs, "6 sound messages, the bad one, the seal")
			require.Equal(t, 1, kinds[event.RunResumed], "one drive, before the corruption")
			require.Equal(t, 1, kinds[event.RunFailed])
			pending, err := b.Store.WorkPending(ctx, "", runID)
			require.NoError(t, err)
			require.False(t, pending)

			v, err = b.Runs.Get(ctx, runID)
			require.NoError(t, err)
			require.Equal(t, engine.StatusFailed, v.Status)
			require.Equal(t, event.CodeJournalCorrupt, v.ErrorCode)
			require.Equal(t, uint64(7), v.LastSeq)
			caughtUp(t, p)
			d, err = projections.NewReader(b.pool).GetRun(ctx, runID)
			require.NoError(t, err)
			require.Equal(t, engine.StatusFailed, d.Run.Status)
			require.Equal(t, event.CodeJournalCorrupt, d.Run.ErrorCode)
			require.Equal(t, v.Error, d.Run.Error)
			var n int
			require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM journal_events WHERE run_id = $1", runID).Scan(&n))
			require.Equal(t, 7, n, "journal rows for the sound events and the seal only")
		})
	}
}

// TestCorruptionWhileDriving forges a step_completed while a worker runs
// the step: the worker's next append is fenced out, it finds the bad
// message and seals the run instead of running on.
func TestCorruptionWhileDriving(t *testing.T) {
	t.Parallel()
	b := setup(t, noJournalCheck())
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	b.Worker(t, "w1", paltest.Tools(map[string]workers.Tool{"hold": func(context.Context, json.RawMessage) (json.RawMessage, error) {
		started <- struct{}{}
		<-release
		return json.RawMessage(`{}`), nil
	}}))
	ctx := context.Background()
	wf := `{"name":"hold","nodes":[{"id":"start","type":"trigger"},{"id":"t1","type":"tool","data":{"tool":"hold"}},
		{"id":"t2","type":"tool","data":{"tool":"hold"}}],"edges":[{"from":"start","to":"t1"},{"from":"t1","to":"t2"}]}`
	runID := b.Start(t, wf, `{}`)
	<-started
	last := lastRaw(t, b, runID)
	evs, err := event.Decode(last.Data)
	require.NoError(t, err)
	seq := evs[len(evs)-1].Seq + 1
	_, err = b.JS.Publish(ctx, eventstore.EventsSubject(runID),
		forge(t, event.StepCompleted, runID, seq, event.Hash(last.Data), "mallory", event.StepCompletedData{Output: json.RawMessage(`"forged"`)}))
	require.NoError(t, err)
	close(release)
	end := b.WaitEnd(t, runID)
	require.Equal(t, event.RunFailed, end.Kind)
	var fd event.RunFailedData
	require.NoError(t, end.DecodeData(&fd))
	require.Equal(t, event.CodeJournalCorrupt, fd.Code)
	require.Equal(t, seq, fd.Seq)
	kinds, _ := rawKinds(t, b, runID)
	require.Equal(t, 1, kinds[event.RunResumed])
	require.Equal(t, 1, kinds[event.RunFailed])
	require.Zero(t, kinds[event.StepStarted]-1, "t2 never started")
}
