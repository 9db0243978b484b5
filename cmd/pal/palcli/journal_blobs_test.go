package palcli_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/paltest"
)

// namedBlob is a blob a journal names and the first event naming it.
type namedBlob struct {
	event.NamedBlob
	seq    uint64
	packed bool // in a message of several events
}

// journalBlobRefs lists the distinct blobs the messages name, in order.
func journalBlobRefs(t *testing.T, msgs [][]byte) []namedBlob {
	t.Helper()
	var out []namedBlob
	seen := map[string]bool{}
	for _, m := range msgs {
		evs, err := event.Decode(m)
		require.NoError(t, err)
		for _, ev := range evs {
			refs, err := event.Blobs(ev)
			require.NoError(t, err)
			for _, r := range refs {
				if !seen[r.Blob] {
					seen[r.Blob] = true
					out = append(out, namedBlob{NamedBlob: r, seq: ev.Seq, packed: len(evs) > 1})
				}
			}
		}
	}
	return out
}

// TestRunExportVerifyBlobs: a strict-mode run with a step value over the
// blob threshold exports with --blobs to a complete archive (the journal
// unchanged on stdout, each blob in DIR under its sha256), which verifies;
// a changed, missing or oversized blob file fails verify naming the seq and
// the sha256, a file already right is not written again, and an object
// missing from PAL_BLOBS fails the export naming them.
func TestRunExportVerifyBlobs(t *testing.T) {
	t.Parallel()
	b := stackBundle(t, paltest.Strict())
	big := strings.Repeat("b", 2*eventstore.DefaultBlobThreshold)
	id := b.Start(t, paltest.Chain("big", 2, func(i int, _ string) (string, string) {
		id := fmt.Sprintf("t%d", i)
		return id, fmt.Sprintf(`{"id":%q,"type":"tool","data":{"tool":"echo","input":{"v":"{{input.v}}","i":%d}}}`, id, i)
	}), `{"v":"`+big+`"}`)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, id).Kind)
	msgs := stored(t, b, id)
	refs := journalBlobRefs(t, msgs)
	require.GreaterOrEqual(t, len(refs), 3, "the run's input and the two steps' values are blobs")
	packed := false
	for _, r := range refs {
		packed = packed || r.packed
	}
	require.True(t, packed, "a blob is named from a packed message")
	var out namedBlob // t1's output
	for _, ev := range b.Events(t, id) {
		if ev.Kind == event.StepCompleted && ev.StepID == "t1" {
			for _, r := range refs {
				if r.seq == ev.Seq {
					out = r
				}
			}
		}
	}
	require.Equal(t, "output", out.Field, "t1's output is a blob first named by its step_completed")
	var total int64
	for _, r := range refs {
		total += r.Size
	}

	plain := b.pal(t, nil, "run", "export", id)
	require.Equal(t, 0, plain.code, "%s", plain)
	dir := filepath.Join(b.dir, "archive", "blobs") // made by the export
	r := b.pal(t, nil, "run", "export", id, "--blobs", dir)
	require.Equal(t, 0, r.code, "%s", r)
	require.Equal(t, plain.stdout, r.stdout, "the journal is the same bytes with --blobs")
	require.Equal(t, fmt.Sprintf("wrote %d blobs (%d bytes) to %s\n", len(refs), total, dir), r.stderr)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, len(refs), "one file per blob, no temporary file left")
	outPath := filepath.Join(dir, out.Blob)
	value, err := os.ReadFile(outPath)
	require.NoError(t, err)
	sum := sha256.Sum256(value)
	require.Equal(t, out.Blob, hex.EncodeToString(sum[:]))
	require.Equal(t, out.Size, int64(len(value)))
	require.Contains(t, string(value), `"v":"`+big+`"`)
	fi, err := os.Stat(outPath)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o644), fi.Mode().Perm())

	journal := b.file(t, "run.jsonl", r.stdout)
	verify := func(t *testing.T) result {
		t.Helper()
		return b.pal(t, nil, "run", "verify", journal, "--blobs", dir)
	}
	r = verify(t)
	require.Equal(t, 0, r.code, "%s", r)
	require.Contains(t, r.stdout, fmt.Sprintf("run %s: ", id))
	require.Contains(t, r.stdout, fmt.Sprintf("%d blobs (%d bytes) in %s match", len(refs), total, dir))
	r = b.pal(t, nil, "run", "verify", journal)
	require.Equal(t, 0, r.code, "%s", r)
	require.NotContains(t, r.stdout, "blobs", "without --blobs verify is as before")

	// A file already right is not written again.
	old := time.Now().Add(-time.Hour).Truncate(time.Second)
	require.NoError(t, os.Chtimes(outPath, old, old))
	r = b.pal(t, nil, "run", "export", id, "--blobs", dir)
	require.Equal(t, 0, r.code, "%s", r)
	require.Equal(t, fmt.Sprintf("wrote 0 blobs (0 bytes) to %s; %d already there\n", dir, len(refs)), r.stderr)
	fi, err = os.Stat(outPath)
	require.NoError(t, err)
	require.Equal(t, old, fi.ModTime())

	// One byte changed: verify names the first seq naming the blob and its
	// sha; a new export writes it again.
	changed := append([]byte(nil), value...)
	changed[len(changed)/2] = 'c'
	require.NoError(t, os.WriteFile(outPath, changed, 0o644))
	r = verify(t)
	require.Equal(t, 1, r.code, "%s", r)
	require.Contains(t, r.stderr, fmt.Sprintf("run %s seq %d output: the bytes of blob %s in %s do not match its hash", id, out.seq, out.Blob, dir))
	r = b.pal(t, nil, "run", "export", id, "--blobs", dir)
	require.Equal(t, 0, r.code, "%s", r)
	require.Contains(t, r.stderr, fmt.Sprintf("wrote 1 blobs (%d bytes) to %s", out.Size, dir))
	got, err := os.ReadFile(outPath)
	require.NoError(t, err)
	require.Equal(t, value, got)
	require.Equal(t, 0, verify(t).code)

	// Missing.
	require.NoError(t, os.Remove(outPath))
	r = verify(t)
	require.Equal(t, 1, r.code, "%s", r)
	require.Contains(t, r.stderr, fmt.Sprintf("run %s seq %d output: blob %s is not in %s", id, out.seq, out.Blob, dir))

	// Larger than any blob may be (sparse: nothing is on disk to read, and
	// a verify that read it would run out of memory or time).
	require.NoError(t, os.WriteFile(outPath, nil, 0o644))
	require.NoError(t, os.Truncate(outPath, 1<<40))
	r = verify(t)
	require.Equal(t, 1, r.code, "%s", r)
	require.Contains(t, r.stderr, fmt.Sprintf("seq %d output: blob %s in %s is %d bytes, more than the %d a blob may be", out.seq, out.Blob, dir, int64(1<<40), event.MaxBlobBytes))
	require.NoError(t, os.Remove(outPath))

	// A FIFO under the blob's name is refused without opening it (which
	// would block until a writer came).
	require.NoError(t, syscall.Mkfifo(outPath, 0o644))
	r = verify(t)
	require.Equal(t, 1, r.code, "%s", r)
	require.Contains(t, r.stderr, fmt.Sprintf("seq %d output: blob %s in %s is not a regular file", out.seq, out.Blob, dir))
	require.NoError(t, os.Remove(outPath))

	// Other bytes of the same size in PAL_BLOBS, then none (as retention
	// removes it): the export still writes the whole journal, and fails
	// naming the seq and the sha; no file is left under the blob's name.
	ctx := context.Background()
	obs, err := b.JS.ObjectStore(ctx, eventstore.BlobBucket)
	require.NoError(t, err)
	_, err = obs.PutBytes(ctx, out.Blob, changed)
	require.NoError(t, err)
	other := filepath.Join(b.dir, "other")
	r = b.pal(t, nil, "run", "export", id, "--blobs", other)
	require.Equal(t, 1, r.code, "%s", r)
	require.Equal(t, plain.stdout, r.stdout)
	require.Contains(t, r.stderr, fmt.Sprintf("run %s seq %d output: bad blob reference: the stored bytes of blob %s do not match its hash", id, out.seq, out.Blob))
	require.NoFileExists(t, filepath.Join(other, out.Blob))
	require.NoError(t, obs.Delete(ctx, out.Blob))
	r = b.pal(t, nil, "run", "export", id, "--blobs", other)
	require.Equal(t, 1, r.code, "%s", r)
	require.Equal(t, plain.stdout, r.stdout)
	require.Contains(t, r.stderr, fmt.Sprintf("run %s seq %d output: bad blob reference: blob %s is not in %s", id, out.seq, out.Blob, eventstore.BlobBucket))
}

// TestRunExportVerifyNoBlobs: a run without big values exports with
// --blobs writing no blob (DIR is made, empty), and verifies with it.
func TestRunExportVerifyNoBlobs(t *testing.T) {
	t.Parallel()
	b := stackBundle(t)
	id := b.Start(t, paltest.EchoChain(2), `{}`)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, id).Kind)
	dir := filepath.Join(b.dir, "blobs")
	r := b.pal(t, nil, "run", "export", id, "--blobs", dir)
	require.Equal(t, 0, r.code, "%s", r)
	require.Equal(t, fmt.Sprintf("wrote 0 blobs (0 bytes) to %s\n", dir), r.stderr)
	require.Equal(t, len(stored(t, b, id)), strings.Count(r.stdout, "\n"))
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Empty(t, entries)
	r = b.pal(t, nil, "run", "verify", b.file(t, "run.jsonl", r.stdout), "--blobs", dir)
	require.Equal(t, 0, r.code, "%s", r)
	require.Contains(t, r.stdout, fmt.Sprintf("0 blobs (0 bytes) in %s match", dir))
}
