package palcli

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/receipt"
)

// maxReceiptFile bounds the receipt file pal receipt verify reads.
const maxReceiptFile = 64 << 10

func (e *env) runReceiptCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "receipt RUN_ID [-o FILE]",
		Short: "Print a finished run's signed receipt (JSON)",
		Long: `pal run receipt prints the signed receipt of a run that has ended, as stored
in the KV bucket PAL_RECEIPTS: the run, how it ended, the seq range, event
count and hash-chain head of its journal, its token and cost totals, the
signing key's id and the Ed25519 signature. With -o it writes the file
instead. Check it offline with pal receipt verify against pal run export's
journal.

Exit codes: 0 printed, 2 bad run id, 3 no receipt (unknown run, not ended,
or not signed yet), 4 NATS unreachable.`,
		Args: cobra.ExactArgs(1),
		RunE: e.withSettings(func(cmd *cobra.Command, args []string, s *settings) error {
			runID := args[0]
			if err := event.ValidateRunID(runID); err != nil {
				return withCode(ExitBadInput, err)
			}
			client, closeNC, err := e.connectClient(cmd.Context(), s)
			if err != nil {
				return err
			}
			defer closeNC()
			store := client.Store()
			rs, err := receipt.Open(cmd.Context(), store.JetStream(), store)
			if err != nil {
				return withCode(ExitUnavailable, err)
			}
			r, err := rs.Get(cmd.Context(), runID)
			switch {
			case errors.Is(err, receipt.ErrNotFound):
				return withCode(ExitNotFound, fmt.Errorf("run %s has no receipt: it is unknown, has not ended, or is not signed yet", runID))
			case err != nil:
				return withCode(ExitUnavailable, err)
			}
			b, err := json.MarshalIndent(r, "", "  ")
			if err != nil {
				return err
			}
			b = append(b, '\n')
			if out, _ := cmd.Flags().GetString("output"); out != "" {
				return os.WriteFile(out, b, 0o644)
			}
			_, err = e.stdout.Write(b)
			return err
		}),
	}
	cmd.Flags().StringP("output", "o", "", "write the receipt to FILE instead of stdout")
	return cmd
}

func (e *env) receiptCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "receipt",
		Short: "Check signed run receipts",
	}
	verify := &cobra.Command{
		Use:   "verify RECEIPT --journal FILE --pubkey FILE",
		Short: "Check a receipt against an exported journal, offline",
		Long: `pal receipt verify checks RECEIPT (pal run receipt's JSON) against the
journal pal run export wrote (--journal) and the public key (--pubkey: a
PEM "PUBLIC KEY" file, as pal dev writes to .pal/pal.pub, or the pem of
GET /v1/keys; repeat it for retired keys). Nothing is fetched.

It checks the Ed25519 signature over the receipt's canonical JSON, then
recomputes the journal's hash chain and totals and compares them with the
receipt. When one byte of one event changed it names that event's seq.

Exit codes: 0 the receipt matches, 1 it does not (the reason and, when it
can, the first bad seq are printed), 2 a file cannot be read.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			journal, _ := cmd.Flags().GetString("journal")
			pubs, _ := cmd.Flags().GetStringArray("pubkey")
			if journal == "" || len(pubs) == 0 {
				return withCode(ExitBadInput, errors.New("--journal and --pubkey are required"))
			}
			r, err := readReceipt(args[0])
			if err != nil {
				return withCode(ExitBadInput, err)
			}
			var keys []receipt.PublicKey
			for _, p := range pubs {
				k, err := receipt.LoadPublicKey(p)
				if err != nil {
					return withCode(ExitBadInput, err)
				}
				keys = append(keys, k)
			}
			msgs, err := readJournal(journal)
			if err != nil {
				return err
			}
			if err := receipt.Verify(r, keys, msgs); err != nil {
				return withCode(ExitRunFailed, err)
			}
			fmt.Fprintf(e.stdout, "receipt of run %s matches: %s, seq %d–%d, %d events, chain head %s, signed by key %s at %s\n",
				r.RunID, r.Status, r.FirstSeq, r.LastSeq, r.Events, r.JournalDigest, r.KeyID, r.SignedAt.Format("2006-01-02T15:04:05.000Z07:00"))
			return nil
		},
	}
	verify.Flags().String("journal", "", "the run's journal, as pal run export wrote it")
	verify.Flags().StringArray("pubkey", nil, "a PEM public key file (repeatable)")
	cmd.AddCommand(verify)
	return cmd
}

func readReceipt(path string) (*receipt.Receipt, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxReceiptFile+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxReceiptFile {
		return nil, fmt.Errorf("%s is larger than %d bytes: not a receipt", path, maxReceiptFile)
	}
	return receipt.Decode(b)
}

// readJournal reads pal run export's file: one message per line.
func readJournal(path string) ([][]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, withCode(ExitBadInput, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), maxJournalLine)
	var msgs [][]byte
	for sc.Scan() {
		if len(msgs) >= receipt.MaxMessages {
			return nil, withCode(ExitRunFailed, fmt.Errorf("the journal has more than %d messages", receipt.MaxMessages))
		}
		msgs = append(msgs, append([]byte(nil), sc.Bytes()...))
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, withCode(ExitRunFailed, fmt.Errorf("line %d is longer than %d bytes: not a journal message", len(msgs)+1, maxJournalLine))
		}
		return nil, withCode(ExitBadInput, err)
	}
	return msgs, nil
}
