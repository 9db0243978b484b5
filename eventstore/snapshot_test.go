package eventstore_test

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
)

// TestSnapshotBounds: a snapshot over MaxSnapshot is neither put nor read
// (one put there by other means), and a run with none says ErrNoSnapshot.
func TestSnapshotBounds(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{})
	ctx := t.Context()
	const runID = "run_01JNB6W2G8Z4K0S1C5V7X9D3T5"
	_, err := b.store.GetSnapshot(ctx, runID)
	require.ErrorIs(t, err, eventstore.ErrNoSnapshot)
	big := bytes.Repeat([]byte("x"), eventstore.MaxSnapshot+1)
	require.ErrorContains(t, b.store.PutSnapshot(ctx, runID, big), "over")
	obs, err := b.js.ObjectStore(ctx, eventstore.SnapshotBucket)
	require.NoError(t, err)
	_, err = obs.PutBytes(ctx, runID, big)
	require.NoError(t, err)
	_, err = b.store.GetSnapshot(ctx, runID)
	require.ErrorContains(t, err, "over")
	require.NoError(t, b.store.DeleteSnapshot(ctx, runID))
	require.NoError(t, b.store.DeleteSnapshot(ctx, runID), "none is no error")
}

// TestCheckHead: the head Append returned holds; one with another hash,
// seq or stream seq, or on another run's subject, does not.
func TestCheckHead(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{})
	ctx := t.Context()
	const runA, runB = "run_01JNB6W2G8Z4K0S1C5V7X9D3T6", "run_01JNB6W2G8Z4K0S1C5V7X9D3T7"
	ha, err := b.store.Append(ctx, runA, eventstore.Head{}, ev(event.RunCreated, 1))
	require.NoError(t, err)
	hb, err := b.store.Append(ctx, runB, eventstore.Head{}, ev(event.RunCreated, 1))
	require.NoError(t, err)
	require.NoError(t, b.store.CheckHead(ctx, runA, ha))
	require.NoError(t, b.store.CheckHead(ctx, runB, hb))
	bad := []eventstore.Head{
		{Seq: ha.Seq, StreamSeq: ha.StreamSeq, Hash: hb.Hash},
		{Seq: ha.Seq + 1, StreamSeq: ha.StreamSeq, Hash: ha.Hash},
		{Seq: ha.Seq, StreamSeq: hb.StreamSeq, Hash: hb.Hash},
		{Seq: ha.Seq, StreamSeq: hb.StreamSeq + 10, Hash: ha.Hash},
		{},
	}
	for i, h := range bad {
		require.Error(t, b.store.CheckHead(ctx, runA, h), "head %d", i)
	}
}
