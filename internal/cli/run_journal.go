package cli

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/palrun/pal/event"
)

// maxJournalLine bounds one line pal run verify reads: a journal message
// is at most the stream's max message size (1 MiB by default).
const maxJournalLine = 16 << 20

func (e *env) runExportCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "export RUN_ID",
		Short: "Write a run's journal, one stored message per line",
		Long: `pal run export writes every message on the run's journal subject
(pal.events.<run_id>) to stdout, one per line, exactly as stored: a packed
message (strict durability) stays one line, a JSON array of events, and a
message that is not a PAL event is written too. pal run verify checks the
file offline. PAL never writes a newline inside a message; one that holds
one (not PAL's) spans lines and reads as corrupt.

Exit codes: 0 written, 2 bad run id, 3 unknown run, 4 NATS unreachable.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			runID := args[0]
			if err := event.ValidateRunID(runID); err != nil {
				return withCode(ExitBadInput, err)
			}
			store, nc, err := e.storeNow(cmd)
			if err != nil {
				return err
			}
			defer nc.Close()
			w := bufio.NewWriter(e.stdout)
			n, werr := 0, error(nil)
			err = store.Scan(cmd.Context(), runID, 0, 0, func(_ uint64, body []byte) {
				n++
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
			}
			return nil
		},
	}
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
the reason are printed), 2 the file cannot be read.`,
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
			return e.verifyJournal(r, runID)
		},
	}
	cmd.Flags().String("run", "", "the run the journal belongs to (default: the run of its first event)")
	return cmd
}

// verifyJournal checks the journal in r, one message per line.
func (e *env) verifyJournal(r io.Reader, runID string) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxJournalLine)
	var c *event.Chain
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
	fmt.Fprintf(e.stdout, "run %s: %d events in %d messages verify; head sha256 %s\n", c.RunID, evs, msgs, c.Hash)
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
