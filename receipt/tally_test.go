package receipt_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/receipt"
)

// packedJournal is sampleJournal's events as a packing store writes them:
// several events to a message, each message's prev the hash of the one
// before.
func packedJournal(t *testing.T) [][]byte {
	t.Helper()
	var evs []event.Event
	for _, body := range sampleJournal(t) {
		got, err := event.Decode(body)
		require.NoError(t, err)
		evs = append(evs, got...)
	}
	var out [][]byte
	prev := ""
	for _, g := range [][]event.Event{evs[:1], evs[1:3], evs[3:5], evs[5:]} {
		for i := range g {
			g[i].Prev = prev
		}
		b, err := event.Encode(g...)
		require.NoError(t, err)
		out = append(out, b)
		prev = event.Hash(b)
	}
	return out
}

// tallied feeds a tally the events of msgs as a worker takes them (as
// read or appended, one by one) and builds its receipt from the chain
// head.
func tallied(t *testing.T, runID string, msgs [][]byte) (*receipt.Receipt, error) {
	t.Helper()
	tally := receipt.NewTally(runID)
	var last uint64
	for _, body := range msgs {
		evs, err := event.Decode(body)
		require.NoError(t, err)
		for _, ev := range evs {
			tally.Add(ev)
			last = ev.Seq
		}
	}
	return tally.Receipt(last, event.Hash(msgs[len(msgs)-1]))
}

// TestTallyEqualsBuild: the receipt a worker builds from its tally of a
// journal's events and the chain head is the one Build makes of the
// journal's bytes (and so the one Verify rebuilds), packed or not.
func TestTallyEqualsBuild(t *testing.T) {
	t.Parallel()
	for name, msgs := range map[string][][]byte{"one event a message": sampleJournal(t), "packed": packedJournal(t)} {
		t.Run(name, func(t *testing.T) {
			want, err := receipt.Build("run1", msgs)
			require.NoError(t, err)
			got, err := tallied(t, "run1", msgs)
			require.NoError(t, err)
			require.Equal(t, want, got)
			require.Equal(t, len(msgs), got.Messages)
			k := newKey(t)
			require.NoError(t, k.Sign(got, time.Now()))
			require.NoError(t, receipt.Verify(got, []receipt.PublicKey{k.PublicKey}, msgs))
		})
	}
}

// TestTallyRefusesWhatIsNotAJournal: a tally that missed an event, took
// another run's or one after the end, does not reach the head, or ends
// with a seal (whose unsound messages no event shows) builds no receipt:
// the worker reads the journal instead.
func TestTallyRefusesWhatIsNotAJournal(t *testing.T) {
	t.Parallel()
	var evs []event.Event
	for _, body := range sampleJournal(t) {
		got, err := event.Decode(body)
		require.NoError(t, err)
		evs = append(evs, got...)
	}
	last := evs[len(evs)-1]
	head := "h"
	take := func(evs ...event.Event) *receipt.Tally {
		tally := receipt.NewTally("run1")
		tally.Add(evs...)
		return tally
	}
	_, err := take(append(append([]event.Event{}, evs[:2]...), evs[3:]...)...).Receipt(last.Seq, head)
	require.ErrorContains(t, err, "seq 4 after seq 2")
	other := evs[2]
	other.RunID = "run2"
	_, err = take(append(append(append([]event.Event{}, evs[:2]...), other), evs[3:]...)...).Receipt(last.Seq, head)
	require.ErrorContains(t, err, `an event of run "run2"`)
	after := last
	after.Seq++
	_, err = take(append(append([]event.Event{}, evs...), after)...).Receipt(after.Seq, head)
	require.ErrorContains(t, err, "after the run ended")
	_, err = take(evs...).Receipt(last.Seq+1, head)
	require.ErrorContains(t, err, "the tally ends at seq 7, the journal at 8")
	_, err = take(evs[:len(evs)-1]...).Receipt(last.Seq-1, head)
	require.ErrorIs(t, err, receipt.ErrNotEnded)

	// A sealed journal: run_created, a message that is no event, the seal.
	msgs := journal(t, "run1", event.MustNew(event.RunCreated, "", 0, event.RunCreatedData{WorkflowName: "triage", Input: json.RawMessage(`{}`)}))
	garbage := []byte(`{"not":"an event"}`)
	seal := (&event.CorruptError{RunID: "run1", Seq: 2, Reason: "no event"}).Seal()
	seal.WorkerID, seal.Prev, seal.TS = "w1", event.Hash(garbage), time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	sealBody, err := event.Encode(seal)
	require.NoError(t, err)
	msgs = append(msgs, garbage, sealBody)
	built, err := receipt.Build("run1", msgs)
	require.NoError(t, err)
	require.Equal(t, 3, built.Messages)
	created, err := event.Decode(msgs[0])
	require.NoError(t, err)
	_, err = take(created[0], seal).Receipt(2, event.Hash(sealBody))
	require.ErrorContains(t, err, "sealed")
}
