package eventstore_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
)

// bigOutput is a step output of about n bytes, as the worker journals it.
func bigOutput(n int) json.RawMessage {
	return json.RawMessage(`{"text":"` + strings.Repeat("a", n) + `","model":"m"}`)
}

func completed(n int, out json.RawMessage) event.Event {
	e := event.MustNew(event.StepCompleted, fmt.Sprintf("step-%d", n), 1, event.StepCompletedData{Output: out, DurationMs: 1})
	e.WorkerID = "w1"
	return e
}

// begin creates a run driven by w1 (run_created, run_resumed).
func begin(t *testing.T, s *eventstore.Store, run string) eventstore.Head {
	t.Helper()
	rr := event.MustNew(event.RunResumed, "", 0, event.RunResumedData{Worker: "w1", ResumeCount: 1})
	rr.WorkerID = "w1"
	h, err := s.Append(t.Context(), run, eventstore.Head{}, ev(event.RunCreated, 1), rr)
	require.NoError(t, err)
	return h
}

func blobCount(t *testing.T, b *testBundle) int {
	t.Helper()
	obs, err := b.js.ObjectStore(t.Context(), eventstore.BlobBucket)
	require.NoError(t, err)
	list, err := obs.List(t.Context())
	if err == jetstream.ErrNoObjectsFound {
		return 0
	}
	require.NoError(t, err)
	return len(list)
}

// TestBigOutputRoundTripsThroughBlobs journals a 5 MiB output: the stored
// message carries only its reference, Read gives the exact bytes back, and
// the same value is stored once.
func TestBigOutputRoundTripsThroughBlobs(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{})
	ctx := t.Context()
	require.Equal(t, eventstore.DefaultBlobThreshold, b.store.BlobThreshold())
	out := bigOutput(5 << 20)
	h := begin(t, b.store, "run_blob")
	sent := completed(2, out)
	h, err := b.store.Append(ctx, "run_blob", h, sent)
	require.NoError(t, err)
	require.Contains(t, string(sent.Data), `"output":{"text"`, "the caller keeps its event as it was")

	m := b.lastMsg(t, "run_blob")
	require.Less(t, len(m.Data), 1024, "the journal holds the reference, not the value")
	require.NotContains(t, string(m.Data), "aaaa")
	stored, err := event.Decode(m.Data)
	require.NoError(t, err)
	ref, ok, err := event.BlobOf(stored[0])
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, event.BlobRef{Blob: event.BlobSum(out), Size: int64(len(out))}, ref)
	require.Equal(t, event.Hash(m.Data), h.Hash, "the chain is over the stored bytes")

	evs, _, err := b.store.Read(ctx, "run_blob")
	require.NoError(t, err)
	require.Len(t, evs, 3)
	var d event.StepCompletedData
	require.NoError(t, evs[2].DecodeData(&d))
	require.True(t, bytes.Equal(out, d.Output), "the output reads back byte for byte")
	require.Nil(t, d.OutputBlob)

	// The same value in another event, and another run: one object.
	h2 := begin(t, b.store, "run_blob2")
	fin := event.MustNew(event.RunSucceeded, "", 0, event.RunSucceededData{Output: out})
	fin.WorkerID = "w1"
	_, err = b.store.Append(ctx, "run_blob2", h2, completed(2, out), fin)
	require.NoError(t, err)
	require.Equal(t, 1, blobCount(t, b))
	evs, _, err = b.store.Read(ctx, "run_blob2")
	require.NoError(t, err)
	var s event.RunSucceededData
	require.NoError(t, evs[3].DecodeData(&s))
	require.True(t, bytes.Equal(out, s.Output))

	// Read again, the value comes from the store's cache of verified
	// values; a store without it finds the object gone.
	obs, err := b.js.ObjectStore(ctx, eventstore.BlobBucket)
	require.NoError(t, err)
	require.NoError(t, obs.Delete(ctx, event.BlobSum(out)))
	_, _, err = b.store.Read(ctx, "run_blob")
	require.NoError(t, err)
	_, _, err = b.openStore(t).Read(ctx, "run_blob")
	require.ErrorIs(t, err, event.ErrBlob)
	require.ErrorContains(t, err, "is not in PAL_BLOBS")
	// ReadAfterRefs gives the events as stored, and so needs no blob.
	asStored, _, err := b.openStore(t).ReadAfterRefs(ctx, "run_blob", eventstore.Head{})
	require.NoError(t, err)
	require.Len(t, asStored, 3)
	require.Equal(t, string(stored[0].Data), string(asStored[2].Data), "the reference, not the value")
	// Putting it again puts it back.
	_, err = b.store.Append(ctx, "run_blob", h, completed(3, out))
	require.NoError(t, err)
	_, _, err = b.openStore(t).Read(ctx, "run_blob")
	require.NoError(t, err)

	// A value at the threshold stays inline.
	small := bigOutput(2000)
	s3 := b.openStore(t, eventstore.WithBlobThreshold(len(small)))
	h3 := begin(t, s3, "run_blob3")
	_, err = s3.Append(ctx, "run_blob3", h3, completed(2, small))
	require.NoError(t, err)
	require.Contains(t, string(b.lastMsg(t, "run_blob3").Data), `"output":{"text"`)
	require.Equal(t, 1, blobCount(t, b))
}

// TestBlobThresholdIsBounded: no threshold lets a value inline that would
// make a packed message too large, or go below the minimum.
func TestBlobThresholdIsBounded(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{MaxEventBytes: 64 << 10})
	require.Equal(t, 16<<10, b.openStore(t, eventstore.WithBlobThreshold(1<<30)).BlobThreshold())
	require.Equal(t, eventstore.MinBlobThreshold, b.openStore(t, eventstore.WithBlobThreshold(1)).BlobThreshold())
}

// TestPackedAppendSplitsBigMessages: in strict mode a packed step boundary
// of values near the threshold is split over messages that fit.
func TestPackedAppendSplitsBigMessages(t *testing.T) {
	t.Parallel()
	const limit = 8 << 10
	b := setup(t, eventstore.Config{MaxEventBytes: limit}, eventstore.WithPacking(true))
	ctx := t.Context()
	th := b.store.BlobThreshold()
	require.Equal(t, limit/4, th)
	h := begin(t, b.store, "run_pack")
	var evs []event.Event
	for i := 3; i <= 8; i++ {
		evs = append(evs, completed(i, bigOutput(th-64)))
	}
	h, err := b.store.Append(ctx, "run_pack", h, evs...)
	require.NoError(t, err)
	require.Equal(t, uint64(8), h.Seq)
	n := b.msgCount(t, eventstore.EventsStream)
	require.Greater(t, n, uint64(2), "split into several messages")
	require.Equal(t, 0, blobCount(t, b), "every value stayed inline")
	got, _, err := b.store.Read(ctx, "run_pack")
	require.NoError(t, err)
	require.Len(t, got, 8)
}

// TestForgedBlobReferenceIsRefused: a reference whose object's bytes do
// not hash to it, that names no object, or that is malformed is refused
// on read.
func TestForgedBlobReferenceIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{})
	ctx := t.Context()
	obs, err := b.js.ObjectStore(ctx, eventstore.BlobBucket)
	require.NoError(t, err)
	good := []byte(`"the real value"`)
	forged := []byte(`"a forged value"`)
	require.Len(t, forged, len(good))
	// Someone who may write PAL_BLOBS puts other bytes under good's name.
	_, err = obs.PutBytes(ctx, event.BlobSum(good), forged)
	require.NoError(t, err)

	cases := map[string]string{
		"hash mismatch": fmt.Sprintf(`{"output_blob":{"blob":%q,"size":%d},"duration_ms":1}`, event.BlobSum(good), len(good)),
		"no object":     fmt.Sprintf(`{"output_blob":{"blob":%q,"size":5},"duration_ms":1}`, event.BlobSum([]byte("nope!"))),
		"size lies":     fmt.Sprintf(`{"output_blob":{"blob":%q,"size":1000},"duration_ms":1}`, event.BlobSum(good)),
		"too big":       fmt.Sprintf(`{"output_blob":{"blob":%q,"size":%d},"duration_ms":1}`, event.BlobSum(good), event.MaxBlobBytes+1),
		"not a sum":     `{"output_blob":{"blob":"../../x","size":5},"duration_ms":1}`,
		"both":          fmt.Sprintf(`{"output":1,"output_blob":{"blob":%q,"size":%d},"duration_ms":1}`, event.BlobSum(good), len(good)),
	}
	for name, data := range cases {
		t.Run(name, func(t *testing.T) {
			run := "run_" + strings.ReplaceAll(name, " ", "_")
			h := begin(t, b.store, run)
			e := ev(event.StepCompleted, 3)
			e.Data = json.RawMessage(data)
			_, err = b.store.Append(ctx, run, h, e)
			require.NoError(t, err)
			_, _, err = b.store.Read(timeout(t, 10e9), run)
			require.ErrorIs(t, err, event.ErrBlob)
		})
	}
}
