package palcli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
)

// maxJournalLine bounds one line pal run verify reads: a journal message
// is at most the stream's max message size (1 MiB by default).
const maxJournalLine = 16 << 20

func (e *env) runExportCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "export RUN_ID",
		Short: "Write a run's journal, one stored message per line",
		Long: `pal run export writes every message on the run's journal subject
(pal.events.<run_id>) to stdout, one per line, exactly as stored: a packed
message (strict durability) stays one line, a JSON array of events, and a
message that is not a PAL event is written too. pal run verify checks the
file offline. PAL never writes a newline inside a message; one that holds
one (not PAL's) spans lines and reads as corrupt.

A big step value is in the journal as a reference to PAL_BLOBS,
<field>_blob {"blob":"<sha256>","size":N}, and retention (PAL_RETENTION)
removes the object with the last journal that names it. --blobs DIR makes the export a
complete archive: stdout is the same journal, and every blob it names is
written to DIR/<sha256> (DIR is created if missing), each checked against
its sha256 and size as it is read. A file already in DIR with the right
bytes is kept. The last line on stderr says how many were written;
pal run verify FILE --blobs DIR checks the archive.

Exit codes: 0 written, 1 a blob the journal names is missing from
PAL_BLOBS, does not match its reference or is malformed (the seq and the
sha256 are printed; the journal on stdout is complete), 2 bad run id or
DIR cannot be written, 3 unknown run, 4 NATS unreachable.`,
		Args: cobra.ExactArgs(1),
		RunE: e.withSettings(func(cmd *cobra.Command, args []string, s *settings) error {
			runID := args[0]
			if err := event.ValidateRunID(runID); err != nil {
				return withCode(ExitBadInput, err)
			}
			blobsDir, _ := cmd.Flags().GetString("blobs")
			client, closeNC, err := e.connectClient(cmd.Context(), s)
			if err != nil {
				return err
			}
			defer closeNC()
			store := client.Store()
			w := bufio.NewWriter(e.stdout)
			var blobs event.BlobSet
			var refErr error // the first malformed reference: reported once the rest is out
			n, werr := 0, error(nil)
			err = store.Scan(cmd.Context(), runID, 0, 0, func(_ uint64, body []byte) {
				n++
				if blobsDir != "" {
					// A message that is not PAL's names no blob; verify reports it.
					if evs, derr := event.Decode(body); derr == nil {
						if aerr := blobs.Add(evs, n); refErr == nil {
							refErr = aerr
						}
					}
				}
				if werr == nil {
					_, werr = w.Write(append(body, '\n'))
				}
			})
			if err == nil {
				err = werr
			}
			if err == nil {
				err = w.Flush()
			}
			switch {
			case err != nil:
				return withCode(ExitUnavailable, err)
			case n == 0:
				return withCode(ExitNotFound, fmt.Errorf("run %s not found", runID))
			case blobsDir == "":
				return nil
			}
			if err := e.exportBlobs(cmd.Context(), store, blobsDir, blobs.Uses); err != nil {
				return err
			}
			return withCode(ExitRunFailed, refErr)
		}),
	}
	cmd.Flags().String("blobs", "", "also write every blob the journal names to `DIR`/<sha256>")
	return cmd
}

// exportBlobs writes each blob to dir/<sha256>, read from PAL_BLOBS and
// checked there (Store.Blob); one already in dir with its bytes is kept.
func (e *env) exportBlobs(ctx context.Context, store *eventstore.Store, dir string, blobs []event.BlobUse) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return withCode(ExitBadInput, fmt.Errorf("blob directory: %w", err))
	}
	wrote, kept, size := 0, 0, int64(0)
	for _, b := range blobs {
		if checkBlobFile(dir, b.BlobRef) == nil {
			kept++
			continue
		}
		value, err := store.Blob(ctx, b.BlobRef)
		if err != nil {
			code := ExitUnavailable
			if errors.Is(err, event.ErrBlob) {
				code = ExitRunFailed
			}
			return withCode(code, fmt.Errorf("%s: %w", b, err))
		}
		if err := writeBlobFile(dir, b.Blob, value); err != nil {
			return withCode(ExitBadInput, fmt.Errorf("%s: %w", b, err))
		}
		wrote++
		size += b.Size
	}
	msg := fmt.Sprintf("wrote %d blobs (%d bytes) to %s", wrote, size, dir)
	if kept > 0 {
		msg += fmt.Sprintf("; %d already there", kept)
	}
	fmt.Fprintln(e.stderr, msg)
	return nil
}

// writeBlobFile writes value to dir/sum by a rename, so that no file under
// a blob's name ever holds part of it.
func writeBlobFile(dir, sum string, value []byte) error {
	f, err := os.CreateTemp(dir, "."+sum+".*")
	if err != nil {
		return err
	}
	_, err = f.Write(value)
	if err == nil {
		err = f.Chmod(0o644)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), filepath.Join(dir, sum))
	}
	if err != nil {
		_ = os.Remove(f.Name())
	}
	return err
}

// checkBlobFile checks that dir/<sha256> holds the bytes ref names. What
// is not a regular file (a FIFO would block the open), or is of another
// size or over event.MaxBlobBytes, is refused before it is opened, and the
// read stops one byte past the size (the file may grow).
func checkBlobFile(dir string, ref event.BlobRef) error {
	path := filepath.Join(dir, ref.Blob)
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("blob %s is not in %s", ref.Blob, dir)
	case err != nil:
		return err
	case !fi.Mode().IsRegular():
		return fmt.Errorf("blob %s in %s is not a regular file", ref.Blob, dir)
	case fi.Size() > event.MaxBlobBytes:
		return fmt.Errorf("blob %s in %s is %d bytes, more than the %d a blob may be", ref.Blob, dir, fi.Size(), event.MaxBlobBytes)
	case fi.Size() != ref.Size:
		return fmt.Errorf("blob %s in %s is %d bytes, its reference says %d", ref.Blob, dir, fi.Size(), ref.Size)
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	value, err := io.ReadAll(io.LimitReader(f, ref.Size+1))
	if err != nil {
		return err
	}
	if !ref.Holds(value) {
		return fmt.Errorf("the bytes of blob %s in %s do not match its hash", ref.Blob, dir)
	}
	return nil
}

func (e *env) runVerifyCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "verify FILE",
		Short: "Check an exported journal offline",
		Long: `pal run verify checks a journal written by pal run export (FILE, or - for
stdin) without NATS, with the same check every PAL reader applies
(event.Chain): each message's prev is the sha256 of the message before it,
every event is of the run, seq is gapless from 1, and step and run events
come from the worker of the latest run_resumed. The run is the one of the
first event unless --run names it.

A change to a message shows where the next message's prev no longer
matches it, so the seq named is the one after the change; a change to the
last message cannot be seen from the file alone: compare the head hash
printed with the journal's (pal run export again, or the stream).

Exit codes: 0 the journal verifies, 1 it does not (the first bad seq and
the reason are printed), 2 the file cannot be read.

--blobs DIR (written by pal run export --blobs) also checks that every
blob the journal names is DIR/<sha256> with the size and sha256 of its
reference; the first one missing or different is exit 1, naming its seq
and sha256. A file in DIR over 64 MiB (event.MaxBlobBytes) is refused
without being read. Without --blobs the values are not checked: the
chain covers their hashes, not their bytes.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var r io.Reader = cmd.InOrStdin()
			if args[0] != "-" {
				f, err := os.Open(args[0])
				if err != nil {
					return withCode(ExitBadInput, err)
				}
				defer f.Close()
				r = f
			}
			runID, _ := cmd.Flags().GetString("run")
			blobsDir, _ := cmd.Flags().GetString("blobs")
			return e.verifyJournal(r, runID, blobsDir)
		},
	}
	cmd.Flags().String("run", "", "the run the journal belongs to (default: the run of its first event)")
	cmd.Flags().String("blobs", "", "also check the blobs the journal names in `DIR` (from pal run export --blobs)")
	return cmd
}

// verifyJournal checks the journal in r, one message per line, and when
// blobsDir is set the blobs it names there.
func (e *env) verifyJournal(r io.Reader, runID, blobsDir string) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxJournalLine)
	var c *event.Chain
	var blobs event.BlobSet
	msgs, evs := 0, 0
	for sc.Scan() {
		line := sc.Bytes()
		msgs++
		if c == nil {
			if runID == "" {
				runID = firstRunID(line)
			}
			c = &event.Chain{RunID: runID}
		}
		got, err := c.Next(line)
		if err != nil {
			return withCode(ExitRunFailed, fmt.Errorf("line %d: %w", msgs, err))
		}
		evs += len(got)
		if blobsDir != "" {
			if err := blobs.Add(got, msgs); err != nil {
				return withCode(ExitRunFailed, fmt.Errorf("line %d: %w", msgs, err))
			}
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return withCode(ExitRunFailed, fmt.Errorf("line %d is longer than %d bytes: not a journal message", msgs+1, maxJournalLine))
		}
		return withCode(ExitBadInput, err)
	}
	if c == nil {
		return withCode(ExitBadInput, errors.New("the journal is empty"))
	}
	size := int64(0)
	for _, b := range blobs.Uses {
		if err := checkBlobFile(blobsDir, b.BlobRef); err != nil {
			return withCode(ExitRunFailed, fmt.Errorf("line %d: %s: %w", b.Msg, b, err))
		}
		size += b.Size
	}
	fmt.Fprintf(e.stdout, "run %s: %d events in %d messages verify; head sha256 %s\n", c.RunID, evs, msgs, c.Hash)
	if blobsDir != "" {
		fmt.Fprintf(e.stdout, "%d blobs (%d bytes) in %s match\n", len(blobs.Uses), size, blobsDir)
	}
	return nil
}

// firstRunID is the run id of the first event of a message, or "" when
// it does not decode (the chain then reports it).
func firstRunID(body []byte) string {
	evs, err := event.Decode(body)
	if err != nil {
		return ""
	}
	return evs[0].RunID
}
