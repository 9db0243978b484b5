package eventstore_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
)

// TestAppendChainsMessages: Append sets prev to the hash of the message
// before it, the same on every event of a packed message, and every head
// carries the hash of its last message.
func TestAppendChainsMessages(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{})
	packed := b.openStore(t, eventstore.WithPacking(true))
	ctx := t.Context()
	const run = "run_chain"

	h, err := b.store.Append(ctx, run, eventstore.Head{}, ev(event.RunCreated, 1))
	require.NoError(t, err)
	first := b.lastMsg(t, run)
	require.Equal(t, event.Hash(first.Data), h.Hash)
	h, err = packed.Append(ctx, run, h, ev(event.RunResumed, 2), ev(event.StepStarted, 3))
	require.NoError(t, err)
	second := b.lastMsg(t, run)
	evs, err := event.Decode(second.Data)
	require.NoError(t, err)
	require.Len(t, evs, 2)
	require.Equal(t, event.Hash(first.Data), evs[0].Prev)
	require.Equal(t, evs[0].Prev, evs[1].Prev, "one prev per message")
	h, err = b.store.Append(ctx, run, h, ev(event.StepCompleted, 4), ev(event.StepStarted, 5))
	require.NoError(t, err)

	last, err := b.store.LastHead(ctx, run)
	require.NoError(t, err)
	require.Equal(t, h, last)
	read, rh, err := b.store.Read(ctx, run)
	require.NoError(t, err)
	require.Equal(t, h, rh)
	requireJournal(t, run, read, 5)
	require.Empty(t, read[0].Prev)
	require.Equal(t, read[3].Prev == read[4].Prev, false, "unpacked: each message chains on the one before")
}

// TestReadCorruptJournal: a message that does not verify is not returned,
// nor is anything after it; Read says where, and gives the head a seal is
// appended after; once sealed, the journal reads whole again.
func TestReadCorruptJournal(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{})
	ctx := t.Context()
	const run = "run_bad"
	h, err := b.store.Append(ctx, run, eventstore.Head{}, ev(event.RunCreated, 1), ev(event.RunResumed, 2))
	require.NoError(t, err)
	_, err = b.js.Publish(ctx, eventstore.EventsSubject(run), []byte("not an event"))
	require.NoError(t, err)
	// A sound-looking event after it is not read either.
	_, err = b.store.Append(ctx, run, eventstore.Head{Seq: 2, StreamSeq: 3, Hash: event.Hash([]byte("not an event"))}, ev(event.StepStarted, 3))
	require.NoError(t, err)

	evs, head, err := b.store.Read(ctx, run)
	var ce *event.CorruptError
	require.ErrorAs(t, err, &ce)
	require.ErrorIs(t, err, event.ErrJournalCorrupt)
	require.Equal(t, uint64(3), ce.Seq)
	require.Contains(t, ce.Reason, "malformed")
	require.Len(t, evs, 2)
	require.Equal(t, uint64(2), head.Seq, "the seal goes at seq 3")
	require.Equal(t, uint64(4), head.StreamSeq, "after the subject's last message")
	require.Equal(t, event.Hash(b.lastMsg(t, run).Data), head.Hash)
	_, _, err = b.store.ReadAfter(ctx, run, h)
	require.ErrorIs(t, err, event.ErrJournalCorrupt)

	seal, _, err := b.store.Seal(ctx, run, head, ce, "w1")
	require.NoError(t, err)
	require.Equal(t, uint64(3), seal.Seq)
	evs, _, err = b.store.Read(ctx, run)
	require.NoError(t, err, "a sealed journal reads whole")
	require.Len(t, evs, 3)
	require.Equal(t, event.RunFailed, evs[2].Kind)
	var d event.RunFailedData
	require.NoError(t, evs[2].DecodeData(&d))
	require.Equal(t, event.CodeJournalCorrupt, d.Code)
	require.Equal(t, uint64(3), d.Seq)
}

// TestEarlier: which runs have a message at or before a stream sequence.
func TestEarlier(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{})
	ctx := t.Context()
	_, err := b.store.Append(ctx, "run_one", eventstore.Head{}, ev(event.RunCreated, 1)) // stream seq 1
	require.NoError(t, err)
	_, err = b.store.Append(ctx, "run_two", eventstore.Head{}, ev(event.RunCreated, 1)) // stream seq 2
	require.NoError(t, err)
	has, err := b.store.Earlier(ctx, []string{"run_one", "run_two", "run_none"}, 1)
	require.NoError(t, err)
	require.Equal(t, map[string]bool{"run_one": true}, has)
	has, err = b.store.Earlier(ctx, []string{"run_one", "run_two"}, 2)
	require.NoError(t, err)
	require.Equal(t, map[string]bool{"run_one": true, "run_two": true}, has)
	has, err = b.store.Earlier(ctx, []string{"run_none"}, 2)
	require.NoError(t, err)
	require.Empty(t, has)
}
