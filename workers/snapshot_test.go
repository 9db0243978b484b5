package workers_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/runs"
	"github.com/palrun/pal/workers"
)

// snapLoopWorkflow echoes 520 times (over 1,000 events, so the worker
// snapshots it), then waits for signal "go" and echoes what it carried.
const snapLoopWorkflow = `{"name":"snap","nodes":[{"id":"start","type":"trigger"},
	{"id":"each","type":"loop","data":{"maxIterations":520,"until":"false","body":{"name":"b","nodes":[
		{"id":"start","type":"trigger"},
		{"id":"echo","type":"tool","data":{"tool":"echo","input":{"i":"{{input.index}}"}}}],
		"edges":[{"from":"start","to":"echo"}]}}},
	{"id":"hold","type":"wait","data":{"signal":"go"}},
	{"id":"last","type":"tool","data":{"tool":"echo","input":{"n":"{{steps.hold.output.n}}"}}}],
	"edges":[{"from":"start","to":"each"},{"from":"each","to":"hold"},{"from":"hold","to":"last"}]}`

// parkLongRun drives snapLoopWorkflow on worker w1 until it parks on its
// wait and w1 has snapshotted it there, then stops w1.
func parkLongRun(t *testing.T, s *paltest.Stack) (runID string) {
	t.Helper()
	w1 := s.Worker(t, "w1")
	runID = s.Start(t, snapLoopWorkflow, `{}`)
	s.WaitFor(t, runID, "the wait", func(ev event.Event) bool {
		return ev.Kind == event.StepWaiting && ev.StepID == "hold"
	})
	ctx := context.Background()
	require.Eventually(t, func() bool {
		_, head, err := workers.LoadSnapshot(ctx, s.Store, runID)
		last, lerr := s.Store.LastHead(ctx, runID)
		return err == nil && lerr == nil && head.StreamSeq == last.StreamSeq
	}, 30*time.Second, 10*time.Millisecond, "a snapshot at the park")
	require.GreaterOrEqual(t, workers.SnapshotPuts(w1), int64(2), "snapshots as the journal grew, and at the park")
	require.NoError(t, w1.Stop(ctx))
	return runID
}

// finishLongRun signals the parked run and checks it ends as a fold of
// its whole journal says.
func finishLongRun(t *testing.T, s *paltest.Stack, runID string) {
	t.Helper()
	require.NoError(t, s.Runs.Signal(context.Background(), runs.SignalCommand{RunID: runID, Signal: "go",
		Payload: json.RawMessage(`{"n":7}`), By: "test"}))
	end := s.WaitEnd(t, runID)
	require.Equal(t, event.RunSucceeded, end.Kind, "%s", end.Data)
	st, err := engine.Fold(s.Events(t, runID))
	require.NoError(t, err)
	require.JSONEq(t, `{"n":7}`, string(st.Steps["last"].Output))
	require.Equal(t, 520+3, len(st.Order)) // the echoes, the loop, the wait, the last echo
}

// TestResumeFromSnapshot: a worker that has never seen a long run drives
// it from the snapshot another worker left at its park, reading only the
// journal after it, and the run ends as a fold of its whole journal says.
// The snapshot's state equals a fold of the journal up to its head.
func TestResumeFromSnapshot(t *testing.T) {
	t.Parallel()
	s := paltest.New(t)
	runID := parkLongRun(t, s)
	ctx := context.Background()
	snap, head, err := workers.LoadSnapshot(ctx, s.Store, runID)
	require.NoError(t, err)
	evs := s.Events(t, runID)
	require.Equal(t, uint64(len(evs)), head.Seq)
	full, err := engine.Fold(evs)
	require.NoError(t, err)
	require.Equal(t, full.Steps, snap.Steps)
	require.Equal(t, full.Order, snap.Order)
	require.Equal(t, full.Created, snap.Created)
	require.Equal(t, []any{full.Status, full.LastSeq, full.Usage, full.StepsStarted, full.Workflow},
		[]any{snap.Status, snap.LastSeq, snap.Usage, snap.StepsStarted, snap.Workflow})
	now := time.Now()
	require.Equal(t, engine.Next(full.Workflow, full, now), engine.Next(snap.Workflow, snap, now))
	require.Equal(t, "w1", head.Driver)

	w2 := s.Worker(t, "w2")
	finishLongRun(t, s, runID)
	require.GreaterOrEqual(t, workers.SnapshotHits(w2), int64(1))
}

// TestForgedSnapshotIgnored: a snapshot that is garbage, names a head not
// in the run's journal (a wrong hash, another subject's message, a seq
// past the journal), or is of another version is refused, and a worker
// that finds one folds the journal and ends the run as it should.
func TestForgedSnapshotIgnored(t *testing.T) {
	t.Parallel()
	s := paltest.New(t)
	runID := parkLongRun(t, s)
	ctx := context.Background()
	good, err := s.Store.GetSnapshot(ctx, runID)
	require.NoError(t, err)
	other := s.Start(t, `{"name":"o","nodes":[{"id":"start","type":"trigger"},{"id":"hold","type":"wait","data":{"signal":"x"}}],"edges":[{"from":"start","to":"hold"}]}`, `{}`)
	otherHead, err := s.Store.LastHead(ctx, other)
	require.NoError(t, err)

	nl := bytes.IndexByte(good, '\n')
	var h map[string]any
	require.NoError(t, json.Unmarshal(good[:nl], &h))
	forge := func(k string, v any) []byte {
		c := map[string]any{}
		for kk, vv := range h {
			c[kk] = vv
		}
		c[k] = v
		b, err := json.Marshal(c)
		require.NoError(t, err)
		return append(append(b, '\n'), good[nl+1:]...)
	}
	forged := map[string][]byte{
		"garbage":       []byte("{}\nnot a state"),
		"no header":     []byte("nothing"),
		"wrong hash":    forge("hash", event.Hash([]byte("forged"))),
		"other subject": forge("stream_seq", otherHead.StreamSeq),
		"past the end":  forge("stream_seq", h["stream_seq"].(float64)+1e6),
		"other version": forge("v", engine.StateVersion+1),
		"truncated":     good[:nl+1+(len(good)-nl)/2],
	}
	for name, b := range forged {
		require.NoError(t, s.Store.PutSnapshot(ctx, runID, b))
		_, _, err := workers.LoadSnapshot(ctx, s.Store, runID)
		require.Error(t, err, name)
		_, _, err = workers.ResumeSnapshot(ctx, s.Store, runID)
		require.Error(t, err, name)
	}
	// Bytes changed under the object's digest: the state they decode to is
	// not taken.
	require.NoError(t, s.Store.PutSnapshot(ctx, runID, good))
	tamperSnapshot(t, s, runID)
	_, err = s.Store.GetSnapshot(ctx, runID)
	require.ErrorIs(t, err, jetstream.ErrDigestMismatch)
	_, _, err = workers.LoadSnapshot(ctx, s.Store, runID)
	require.ErrorIs(t, err, jetstream.ErrDigestMismatch)
	_, _, err = workers.ResumeSnapshot(ctx, s.Store, runID)
	require.ErrorIs(t, err, jetstream.ErrDigestMismatch)
	// A forged hash: a worker that finds it folds the journal.
	require.NoError(t, s.Store.PutSnapshot(ctx, runID, forge("hash", event.Hash([]byte("forged")))))
	w2 := s.Worker(t, "w2")
	finishLongRun(t, s, runID)
	require.Zero(t, workers.SnapshotHits(w2))
	// The run ended: its snapshot goes.
	require.Eventually(t, func() bool {
		_, err := s.Store.GetSnapshot(ctx, runID)
		return errors.Is(err, eventstore.ErrNoSnapshot)
	}, 10*time.Second, 10*time.Millisecond)
}

// TestSnapshotTailKeepsWriterRule: a step event forged after a snapshot's
// head by a writer that does not drive the run is caught on the read from
// the snapshot, as on a read from the start (the head names its driver):
// the worker folds the whole journal and seals it.
func TestSnapshotTailKeepsWriterRule(t *testing.T) {
	t.Parallel()
	s := paltest.New(t, paltest.NoJournalCheck()) // it forges an event
	runID := parkLongRun(t, s)
	ctx := context.Background()
	forged := event.MustNew(event.StepCompleted, "hold", 1, event.StepCompletedData{Output: json.RawMessage(`{"n":666}`)})
	forged.WorkerID = "intruder"
	s.AppendRaw(t, runID, forged)

	_, head, err := workers.LoadSnapshot(ctx, s.Store, runID)
	require.NoError(t, err, "the snapshot's head still holds")
	_, _, err = s.Store.ReadAfter(ctx, runID, head)
	require.ErrorIs(t, err, event.ErrJournalCorrupt)
	// A resume leaves the state at the snapshot's head, for the drive's
	// own read to meet the forgery.
	st, resumed, err := workers.ResumeSnapshot(ctx, s.Store, runID)
	require.NoError(t, err)
	require.Equal(t, head, resumed)
	require.Equal(t, head.Seq, st.LastSeq)

	w2 := s.Worker(t, "w2")
	require.NoError(t, s.Store.Enqueue(ctx, "", runID, "wake"))
	end := s.WaitEnd(t, runID)
	require.Equal(t, event.RunFailed, end.Kind)
	var d event.RunFailedData
	require.NoError(t, end.DecodeData(&d))
	require.Equal(t, event.CodeJournalCorrupt, d.Code)
	require.Zero(t, workers.SnapshotHits(w2))
}

// TestResumeSnapshotFoldsTail: a resume from a snapshot behind the
// journal's end reads the journal after it and folds it on: the state
// equals a fold of the whole journal, and the head is the journal's,
// naming the driver of the tail's latest run_resumed, so a read from it
// applies the writer rule from the first message on.
func TestResumeSnapshotFoldsTail(t *testing.T) {
	t.Parallel()
	s := paltest.New(t, paltest.NoJournalCheck()) // it forges an event
	runID := parkLongRun(t, s)
	ctx := context.Background()
	_, snapHead, err := workers.LoadSnapshot(ctx, s.Store, runID)
	require.NoError(t, err)
	// A signal, and the run_resumed of a drive by w9.
	require.NoError(t, s.Runs.Signal(ctx, runs.SignalCommand{RunID: runID, Signal: "go", Payload: json.RawMessage(`{"n":1}`), By: "test"}))
	resumed := event.MustNew(event.RunResumed, "", 0, event.RunResumedData{Worker: "w9", ResumeCount: 99})
	resumed.WorkerID, resumed.TraceID = "w9", "0af7651916cd43dd8448eb211c80319c"
	s.AppendRaw(t, runID, resumed)
	evs := s.Events(t, runID)
	require.Greater(t, uint64(len(evs)), snapHead.Seq+1)

	st, head, err := workers.ResumeSnapshot(ctx, s.Store, runID)
	require.NoError(t, err)
	last, err := s.Store.LastHead(ctx, runID)
	require.NoError(t, err)
	require.Equal(t, last.StreamSeq, head.StreamSeq)
	require.Equal(t, last.Hash, head.Hash)
	require.Equal(t, uint64(len(evs)), head.Seq)
	require.Equal(t, "w9", head.Driver)
	full, err := engine.Fold(evs)
	require.NoError(t, err)
	require.Equal(t, full.Steps, st.Steps)
	require.Equal(t, full.Order, st.Order)
	require.Equal(t, full.Signals, st.Signals)
	require.Equal(t, []any{full.Status, full.LastSeq, full.Resumes, full.LastWorker, full.DriveOpen, full.UpdatedAt},
		[]any{st.Status, st.LastSeq, st.Resumes, st.LastWorker, st.DriveOpen, st.UpdatedAt})
	now := time.Now()
	require.Equal(t, engine.Next(full.Workflow, full, now), engine.Next(st.Workflow, st, now))

	// The writer rule holds from that head: a step event by w1, no longer
	// the driver, is corrupt on the read from it.
	forged := event.MustNew(event.StepCompleted, "hold", 1, event.StepCompletedData{Output: json.RawMessage(`{"n":666}`)})
	forged.WorkerID = "w1"
	s.AppendRaw(t, runID, forged)
	_, _, err = s.Store.ReadAfter(ctx, runID, head)
	require.ErrorIs(t, err, event.ErrJournalCorrupt)
}

// TestResumeSnapshotTailDoesNotFold: a tail that verifies but does not
// fold on the snapshot's state is an error, not a state half folded, and
// the worker folds the whole journal, which fails the run.
func TestResumeSnapshotTailDoesNotFold(t *testing.T) {
	t.Parallel()
	s := paltest.New(t, paltest.NoJournalCheck()) // it appends a bad event
	runID := parkLongRun(t, s)
	ctx := context.Background()
	again := event.MustNew(event.RunCreated, "", 0, event.RunCreatedData{Workflow: json.RawMessage(snapLoopWorkflow)})
	s.AppendRaw(t, runID, again)

	_, _, err := workers.LoadSnapshot(ctx, s.Store, runID)
	require.NoError(t, err, "the snapshot itself holds")
	_, _, err = workers.ResumeSnapshot(ctx, s.Store, runID)
	require.ErrorContains(t, err, "run_created")

	w2 := s.Worker(t, "w2")
	require.NoError(t, s.Store.Enqueue(ctx, "", runID, "wake"))
	end := s.WaitEnd(t, runID)
	require.Equal(t, event.RunFailed, end.Kind)
	require.Zero(t, workers.SnapshotHits(w2))
}

// tamperSnapshot changes a digit of run runID's snapshot as stored, in
// its last chunk, leaving the object's digest as it was.
func tamperSnapshot(t *testing.T, s *paltest.Stack, runID string) {
	t.Helper()
	ctx := context.Background()
	obs, err := s.JS.ObjectStore(ctx, eventstore.SnapshotBucket)
	require.NoError(t, err)
	info, err := obs.GetInfo(ctx, runID)
	require.NoError(t, err)
	stream, err := s.JS.Stream(ctx, eventstore.SnapshotStream)
	require.NoError(t, err)
	subj := "$O." + eventstore.SnapshotBucket + ".C." + info.NUID
	var chunks [][]byte
	for seq := uint64(1); ; {
		m, err := stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subj))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		require.NoError(t, err)
		chunks, seq = append(chunks, m.Data), m.Sequence+1
	}
	require.NotEmpty(t, chunks)
	// An echo's output, {"i":N}, says another N: the bytes still decode.
	last := chunks[len(chunks)-1]
	at := bytes.LastIndex(last, []byte(`{"i":`))
	require.GreaterOrEqual(t, at, 0)
	d := &last[at+len(`{"i":`)]
	*d = '0' + (*d-'0'+1)%10
	require.NoError(t, stream.Purge(ctx, jetstream.WithPurgeSubject(subj)))
	for _, c := range chunks {
		_, err := s.JS.Publish(ctx, subj, c)
		require.NoError(t, err)
	}
}

// TestKill9MidLongRunResumesFromSnapshot: a pal worker driving a long loop
// is killed with kill -9 after it has snapshotted the run and gone on
// past the snapshot. Another pal worker, which has never seen the run,
// resumes it from the snapshot (its log says so), folding only the journal
// after it, and the run ends once, every iteration completed exactly
// once; the journal verifies on cleanup (chain and writer rule).
func TestKill9MidLongRunResumesFromSnapshot(t *testing.T) {
	t.Parallel()
	// w2 takes over when w1's presence ends, not at the lease's end; a
	// longer lease keeps a loaded machine from adding a third drive.
	p := setupProc(t, 3*time.Second)
	const iterations = 1500
	wf := fmt.Sprintf(`{"name":"long","nodes":[{"id":"start","type":"trigger"},
	{"id":"each","type":"loop","data":{"maxIterations":%d,"until":"false","body":{"name":"b","nodes":[
		{"id":"start","type":"trigger"},
		{"id":"echo","type":"tool","data":{"tool":"echo","input":{"i":"{{input.index}}"}}}],
		"edges":[{"from":"start","to":"echo"}]}}}],
	"edges":[{"from":"start","to":"each"}]}`, iterations)
	w1 := p.palWorker(t, "w1")
	runID := p.Start(t, wf, `{}`)
	ctx := ctxFor(t, 2*time.Minute)
	var snap eventstore.Head
	require.Eventually(t, func() bool {
		var err error
		_, snap, err = workers.LoadSnapshot(ctx, p.Store, runID)
		return err == nil
	}, time.Minute, 5*time.Millisecond, "w1 snapshotted the run as it grew")
	// Let the journal go on past the snapshot, then kill w1 mid-run.
	require.Eventually(t, func() bool {
		last, err := p.Store.LastHead(ctx, runID)
		return err == nil && last.Seq > snap.Seq+50
	}, time.Minute, time.Millisecond)
	w1.Kill()
	killedAt, err := p.Store.LastHead(ctx, runID)
	require.NoError(t, err)
	evs := p.Events(t, runID)
	require.False(t, evs[len(evs)-1].Kind.Terminal(), "the run ended before the kill; make the loop longer")

	w2 := p.palWorker(t, "w2")
	end := p.WaitEnd(t, runID)
	require.Equal(t, event.RunSucceeded, end.Kind, "%s", end.Data)
	require.NoError(t, w2.WaitForOutput(ctx, "resumed from the run's snapshot"), "%s", w2.Output())
	t.Logf("snapshot at seq %d, killed at seq %d, %d events in all", snap.Seq, killedAt.Seq, end.Seq)

	evs = p.Events(t, runID)
	completed := map[string]int{}
	for _, ev := range evs {
		if ev.Kind == event.StepCompleted && ev.StepID != "each" {
			completed[ev.StepID]++
		}
	}
	require.Len(t, completed, iterations, "one echo per iteration")
	for id, n := range completed {
		require.Equal(t, 1, n, "step %s completed %d times", id, n)
	}
	st, err := engine.Fold(evs)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, st.Status)
	require.Equal(t, 2, st.Resumes, "w1's drive and w2's")
}
