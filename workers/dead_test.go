package workers_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/workers"
)

// TestToolPanicDoesNotStopOtherRuns registers a tool that panics (a bug
// in the embedding program's code): each drive of that run is recovered
// and logged with its work message, the journal counts the crashes, and
// the run ends in crash_loop, while the worker drives other runs.
func TestToolPanicDoesNotStopOtherRuns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	logs := b.captureLogs(t)
	var calls atomic.Int32
	b.worker(t, "w1", map[string]workers.Tool{"boom": func(context.Context, json.RawMessage) (json.RawMessage, error) {
		calls.Add(1)
		panic("tool bug")
	}})
	boom := paltest.Chain("boom", 1, func(int, string) (string, string) {
		return "b1", `{"id":"b1","type":"tool","data":{"tool":"boom","input":{}}}`
	})
	bad := b.Start(t, boom, `{}`)
	logs.Wait(t, "drive panicked")
	good := b.Start(t, echoChain(3), `{}`)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, good).Kind, "the worker drives other runs")

	end := b.WaitEnd(t, bad)
	require.Equal(t, event.RunFailed, end.Kind)
	require.Equal(t, event.CodeCrashLoop, data[event.RunFailedData](t, end).Code)
	require.Equal(t, int32(5), calls.Load(), "one call per drive until crash_loop (MaxCrashes)")
	require.Contains(t, logs.String(), "panic=\"tool bug\"")
	require.Regexp(t, `drive panicked.*run_id=`+bad+`.*work_seq=[1-9]`, logs.String())
	require.Contains(t, logs.String(), "drive crashed; the next counts it toward crash_loop")
	require.Zero(t, deadLetters(t, b), "the journal, not PAL_DEAD, ends a run that crashes after resuming")
}

// TestDrivePanicBeforeResumeIsDeadLettered makes drives of one run panic
// before the journal is read (a test hook: no journal is known to make
// the fold panic), where the journal cannot count the crashes: the work
// message is tried MaxDeliveries times, then goes to PAL_DEAD with its
// reason; other runs are driven meanwhile and after.
func TestDrivePanicBeforeResumeIsDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	logs := b.captureLogs(t)
	w := b.worker(t, "w1", nil)
	var tries atomic.Int32
	bad := "run_poison"
	workers.SetBeforeDrive(w, func(runID string) {
		if runID == bad {
			tries.Add(1)
			panic("fold bug")
		}
	})
	ctx := context.Background()
	// A run nothing created: its work message alone reaches the drive.
	require.NoError(t, b.Store.Enqueue(ctx, "", bad, "test"))
	good := b.Start(t, echoChain(2), `{}`)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, good).Kind)

	logs.Wait(t, "work dead-lettered to PAL_DEAD")
	require.Equal(t, int32(eventstore.MaxDeliveries), tries.Load())
	dead, err := b.JS.Stream(ctx, eventstore.DeadStream)
	require.NoError(t, err)
	m, err := dead.GetLastMsgForSubject(ctx, eventstore.DeadSubject(eventstore.DeadWork))
	require.NoError(t, err)
	require.Equal(t, eventstore.WorkStream, m.Header.Get(eventstore.DeadStreamHeader))
	require.Equal(t, eventstore.WorkSubject("", bad), m.Header.Get(eventstore.DeadSubjectHeader))
	require.Equal(t, strconv.Itoa(eventstore.MaxDeliveries), m.Header.Get(eventstore.DeadDeliveredHeader))
	require.Equal(t, "panic: fold bug", m.Header.Get(eventstore.DeadReasonHeader))
	seq := m.Header.Get(eventstore.DeadSeqHeader)
	require.Regexp(t, `work dead-lettered to PAL_DEAD.*work_seq=`+seq, logs.String())

	work, err := b.JS.Stream(ctx, eventstore.WorkStream)
	require.NoError(t, err)
	_, err = work.GetLastMsgForSubject(ctx, eventstore.WorkSubject("", bad))
	require.ErrorIs(t, err, jetstream.ErrMsgNotFound, "the work message left PAL_WORK")
	after := b.Start(t, echoChain(1), `{}`)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, after).Kind, "the worker goes on")
}

// TestMalformedTimerIsDeadLettered fires a timer whose subject names no
// valid run: it goes to PAL_DEAD at once with the reason.
func TestMalformedTimerIsDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.worker(t, "w1", nil)
	ctx := context.Background()
	_, err := b.JS.Publish(ctx, "pal.timer.fire.bad%id", nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return deadLetters(t, b) == 1 }, 10*time.Second, 10*time.Millisecond)
	dead, err := b.JS.Stream(ctx, eventstore.DeadStream)
	require.NoError(t, err)
	m, err := dead.GetLastMsgForSubject(ctx, eventstore.DeadSubject(eventstore.DeadTimers))
	require.NoError(t, err)
	require.Equal(t, "pal.timer.fire.bad%id", m.Header.Get(eventstore.DeadSubjectHeader))
	require.True(t, strings.Contains(m.Header.Get(eventstore.DeadReasonHeader), "no valid run id"))
}

// deadLetters is how many messages PAL_DEAD holds.
func deadLetters(t *testing.T, b *bundle) uint64 {
	t.Helper()
	s, err := b.JS.Stream(context.Background(), eventstore.DeadStream)
	require.NoError(t, err)
	info, err := s.Info(context.Background())
	require.NoError(t, err)
	return info.State.Msgs
}

// TestUnfoldableJournalWorkIsDeadLettered drives a run whose journal does
// not fold: the run is failed, and its work message, which would fail the
// same way every time, goes to PAL_DEAD at once with the fold's error. So
// does work whose subject names no valid run.
func TestUnfoldableJournalWorkIsDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	runID := createOrphan(t, b, echoChain(2))
	ev := event.MustNew(event.RunCreated, "", 0, event.RunCreatedData{Workflow: json.RawMessage(echoChain(1)), Input: json.RawMessage(`{}`)})
	appendRaw(t, b, runID, ev)
	require.NoError(t, b.Store.Enqueue(ctx, "", runID, "test"))
	_, err := b.JS.Publish(ctx, "pal.work.bad%id", nil)
	require.NoError(t, err)
	b.worker(t, "w1", nil)
	require.Equal(t, event.RunFailed, b.WaitEnd(t, runID).Kind)
	require.Eventually(t, func() bool { return deadLetters(t, b) == 2 }, 10*time.Second, 10*time.Millisecond)
	dead, err := b.JS.Stream(ctx, eventstore.DeadStream)
	require.NoError(t, err)
	reasons := map[string]string{}
	for seq := uint64(1); seq <= 2; seq++ {
		m, err := dead.GetMsg(ctx, seq)
		require.NoError(t, err)
		require.Equal(t, "1", m.Header.Get(eventstore.DeadDeliveredHeader), "no retry for what fails for good")
		reasons[m.Header.Get(eventstore.DeadSubjectHeader)] = m.Header.Get(eventstore.DeadReasonHeader)
	}
	require.Contains(t, reasons[eventstore.WorkSubject("", runID)], "journal does not fold")
	require.Contains(t, reasons["pal.work.bad%id"], "no valid run id")
}
