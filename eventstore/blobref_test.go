package eventstore_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
)

// blobSum is the name a big output gets in PAL_BLOBS: the sha256 of the
// output field's bytes as journaled.
func blobSum(t *testing.T, out json.RawMessage) string {
	t.Helper()
	var d struct {
		Output json.RawMessage `json:"output"`
	}
	require.NoError(t, json.Unmarshal(event.MustNew(event.StepCompleted, "s", 1, event.StepCompletedData{Output: out}).Data, &d))
	return event.BlobSum(d.Output)
}

func hasBlob(t *testing.T, b *testBundle, sum string) bool {
	t.Helper()
	obs, err := b.js.ObjectStore(t.Context(), eventstore.BlobBucket)
	require.NoError(t, err)
	_, err = obs.GetInfo(t.Context(), sum)
	if err == jetstream.ErrObjectNotFound {
		return false
	}
	require.NoError(t, err)
	return true
}

// TestReleaseBlobsKeepsSharedBlobs: a blob two runs name outlives the
// release of the first and goes with the second's; a run's own blob goes
// with it; a release twice deletes nothing more; a blob named with no
// reference (as PAL wrote before it kept references) is left.
func TestReleaseBlobsKeepsSharedBlobs(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{})
	ctx := t.Context()
	release := func(run string) int {
		t.Helper()
		sums, err := b.store.BlobsOf(ctx, run)
		require.NoError(t, err)
		n, err := b.store.ReleaseBlobs(ctx, run, sums)
		require.NoError(t, err)
		return n
	}
	shared, own := bigOutput(300<<10), bigOutput(400<<10)
	sharedSum, ownSum := blobSum(t, shared), blobSum(t, own)

	ha := begin(t, b.store, "run_a")
	_, err := b.store.Append(ctx, "run_a", ha, completed(2, shared), completed(3, own))
	require.NoError(t, err)
	hb := begin(t, b.store, "run_b")
	_, err = b.store.Append(ctx, "run_b", hb, completed(2, shared))
	require.NoError(t, err)
	require.True(t, hasBlob(t, b, sharedSum))
	require.True(t, hasBlob(t, b, ownSum))

	sums, err := b.store.BlobsOf(ctx, "run_a")
	require.NoError(t, err)
	require.ElementsMatch(t, []string{sharedSum, ownSum}, sums)
	require.Equal(t, 1, release("run_a"), "run_a's own blob is deleted")
	require.False(t, hasBlob(t, b, ownSum))
	require.True(t, hasBlob(t, b, sharedSum), "run_b still references the shared blob")
	evs, _, err := b.store.Read(ctx, "run_b")
	require.NoError(t, err)
	require.Contains(t, string(evs[2].Data), string(shared[:100]))

	require.Zero(t, release("run_a"), "released already")
	require.Equal(t, 1, release("run_b"))
	require.False(t, hasBlob(t, b, sharedSum), "no run references it any more")

	// A reference with no PAL_BLOB_REFS entry: drop it as an older PAL
	// would have left it.
	hc := begin(t, b.store, "run_c")
	_, err = b.store.Append(ctx, "run_c", hc, completed(2, own))
	require.NoError(t, err)
	refs, err := b.js.Stream(ctx, eventstore.BlobRefsStream)
	require.NoError(t, err)
	require.NoError(t, refs.Purge(ctx, jetstream.WithPurgeSubject(eventstore.BlobRefPrefix+ownSum+".run_c")))
	require.Zero(t, release("run_c"))
	_, err = b.store.ReleaseBlobs(ctx, "run_c", []string{"../x"})
	require.ErrorContains(t, err, "not a blob name")
	require.True(t, hasBlob(t, b, ownSum), "a blob with no reference may be another unreferenced run's")
}

// TestBlobWriterWaitsOutARelease: a writer that finds the blob it names
// marked for release has already written its reference; it waits until
// the mark goes, and then puts the blob again, which the release deleted
// meanwhile. A mark whose release died goes with its TTL.
func TestBlobWriterWaitsOutARelease(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	out := bigOutput(300 << 10)
	sum := blobSum(t, out)
	h := begin(t, b.store, "run_w")
	// Stored once, so the release below has something to delete.
	_, err := b.store.Append(ctx, "run_w", h, completed(2, out))
	require.NoError(t, err)
	h, err = b.store.LastHead(ctx, "run_w")
	require.NoError(t, err)
	refs, err := b.js.Stream(ctx, eventstore.BlobRefsStream)
	require.NoError(t, err)

	// A release in the middle: the blob is marked.
	mark, err := b.js.PublishMsg(ctx, &nats.Msg{Subject: eventstore.BlobReclaimPrefix + sum},
		jetstream.WithExpectLastSequencePerSubject(0), jetstream.WithMsgTTL(time.Minute))
	require.NoError(t, err)
	// A second run's writer.
	h2 := begin(t, b.store, "run_w2")
	done := make(chan error, 1)
	go func() {
		_, err := b.store.Append(ctx, "run_w2", h2, completed(2, out))
		done <- err
	}()
	require.Eventually(t, func() bool {
		_, err := refs.GetLastMsgForSubject(ctx, eventstore.BlobRefPrefix+sum+".run_w2")
		return err == nil
	}, 30*time.Second, 5*time.Millisecond, "the writer references the blob first")
	select {
	case err := <-done:
		t.Fatalf("the append went past a release mark: %v", err)
	default:
	}
	// The release deletes the object, then its mark.
	obs, err := b.js.ObjectStore(ctx, eventstore.BlobBucket)
	require.NoError(t, err)
	require.NoError(t, obs.Delete(ctx, sum))
	require.NoError(t, refs.DeleteMsg(ctx, mark.Sequence))
	require.NoError(t, <-done)
	require.True(t, hasBlob(t, b, sum), "the writer put the blob again")
	evs, _, err := b.store.Read(ctx, "run_w2")
	require.NoError(t, err)
	require.Contains(t, string(evs[2].Data), string(out[:100]))

	// A mark left by a release that died: the writer waits for its TTL.
	_, err = b.js.PublishMsg(ctx, &nats.Msg{Subject: eventstore.BlobReclaimPrefix + sum},
		jetstream.WithExpectLastSequencePerSubject(0), jetstream.WithMsgTTL(time.Second))
	require.NoError(t, err)
	t0 := time.Now()
	_, err = b.store.Append(ctx, "run_w", h, completed(3, out))
	require.NoError(t, err)
	require.GreaterOrEqual(t, time.Since(t0), 900*time.Millisecond, "the writer waited for the mark")
}

// TestBlobReleaseOnACluster: on three nodes (R3), where a Direct Get may
// be answered by a follower, a shared blob outlives the first release and
// goes with the second; a writer of the same value after that finds it
// gone and puts it again, and the journal reads back whole.
func TestBlobReleaseOnACluster(t *testing.T) {
	t.Parallel()
	ctx := timeout(t, 2*time.Minute)
	s, js := clusterStore(t, ctx)
	obs, err := js.ObjectStore(ctx, eventstore.BlobBucket)
	require.NoError(t, err)
	out := bigOutput(300 << 10)
	sum := blobSum(t, out)
	release := func(run string) int {
		t.Helper()
		sums, err := s.BlobsOf(ctx, run)
		require.NoError(t, err)
		n, err := s.ReleaseBlobs(ctx, run, sums)
		require.NoError(t, err)
		return n
	}
	for _, run := range []string{"run_c1", "run_c2"} {
		_, err := s.Append(ctx, run, begin(t, s, run), completed(2, out))
		require.NoError(t, err)
	}
	require.Zero(t, release("run_c1"), "run_c2 references the blob")
	_, err = obs.GetInfo(ctx, sum)
	require.NoError(t, err)
	require.Equal(t, 1, release("run_c2"))
	// Asked of the leader: the meta says deleted.
	_, err = s.Append(ctx, "run_c3", begin(t, s, "run_c3"), completed(2, out))
	require.NoError(t, err)
	// A Direct Get a follower answers may not have the last append yet
	// (R3 reads are not read-your-writes): read until the journal has it.
	var evs []event.Event
	eventually(t, 10*time.Second, 20*time.Millisecond, func() bool {
		evs, _, err = s.Read(ctx, "run_c3")
		require.NoError(t, err)
		return len(evs) == 3
	}, "run_c3 reads back whole")
	require.Contains(t, string(evs[2].Data), string(out[:100]))
}
