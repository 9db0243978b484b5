package workers_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/receipt"
	"github.com/palrun/pal/runs"
	"github.com/palrun/pal/workers"
)

// gateWorkflow parks on an approval, then runs one step.
const gateWorkflow = `{"name":"gate","nodes":[{"id":"start","type":"trigger"},{"id":"ok","type":"approval","data":{}},
	{"id":"t","type":"tool","data":{"tool":"echo","input":{"i":1}}}],
	"edges":[{"from":"start","to":"ok"},{"from":"ok","to":"t"}]}`

// TestReceiptReadsNoJournal: the worker that ends a run signs its receipt
// from the journal it read and appended as it drove the run, and the
// chain head it holds: driving a run to its end with a signing key reads
// the journal exactly as often as driving it without one, for a run ended
// in one drive and for one woken from a park (its state kept, its tally
// with it). The receipts so signed verify against the journal.
func TestReceiptReadsNoJournal(t *testing.T) {
	t.Parallel()
	s := paltest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reads := journalReads(t, s)
	rs, err := receipt.Open(ctx, s.JS, s.Store)
	require.NoError(t, err)
	key, err := receipt.WriteKey(filepath.Join(t.TempDir(), "pal.key"))
	require.NoError(t, err)
	// Driven outside the work queue (Drive): no work message, no
	// redelivery, the same reads every time.
	plain := workers.New(workers.Config{ID: "plain", Logger: paltest.Logger(t)}, s.Store, s.Leases, nil, nil)
	signer := workers.New(workers.Config{ID: "signer", Logger: paltest.Logger(t), Receipts: rs, SigningKey: key},
		s.Store, s.Leases, nil, nil)

	drive := func(w *workers.Worker, wf string) string {
		runID := s.Start(t, wf, `{}`)
		require.NoError(t, w.Drive(ctx, runID))
		if wf == gateWorkflow {
			require.NoError(t, s.Runs.Approve(ctx, runs.ApproveCommand{RunID: runID, StepID: "ok", Decision: "approve", Approver: "test"}))
			require.NoError(t, w.Drive(ctx, runID))
		}
		return runID
	}
	for _, wf := range []string{paltest.EchoChain(3), gateWorkflow} {
		unsigned, signed := drive(plain, wf), drive(signer, wf)
		require.Positive(t, reads(unsigned), "the reads are seen")
		require.Equal(t, reads(unsigned), reads(signed), "signing read the journal")

		_, err := rs.Get(ctx, unsigned)
		require.ErrorIs(t, err, receipt.ErrNotFound)
		r, err := rs.Get(ctx, signed)
		require.NoError(t, err)
		var msgs [][]byte
		require.NoError(t, s.Store.Scan(ctx, signed, 0, 0, func(_ uint64, b []byte) { msgs = append(msgs, append([]byte(nil), b...)) }))
		require.NoError(t, receipt.Verify(r, []receipt.PublicKey{key.PublicKey}, msgs))
		require.Equal(t, len(msgs), r.Messages)
	}
}

// journalReads counts the reads of a run's journal on s's connection from
// now on: the Direct Gets and message gets on PAL_EVENTS that name the
// run's subject.
func journalReads(t *testing.T, s *paltest.Stack) func(runID string) int {
	t.Helper()
	api := "$JS.API."
	var subs []*nats.Subscription
	for _, subj := range []string{api + "DIRECT.GET." + eventstore.EventsStream, api + "DIRECT.GET." + eventstore.EventsStream + ".>",
		api + "STREAM.MSG.GET." + eventstore.EventsStream} {
		sub, err := s.NC.SubscribeSync(subj)
		require.NoError(t, err)
		subs = append(subs, sub)
	}
	require.NoError(t, s.NC.Flush())
	var gets []*nats.Msg
	return func(runID string) int {
		// Every request sent before the flush is on the subscriptions'
		// queues once it returns.
		require.NoError(t, s.NC.Flush())
		for _, sub := range subs {
			for {
				m, err := sub.NextMsg(10 * time.Millisecond)
				if err != nil {
					break
				}
				gets = append(gets, m)
			}
		}
		subj := eventstore.EventsSubject(runID)
		n := 0
		for _, m := range gets {
			if strings.HasSuffix(m.Subject, "."+subj) || strings.Contains(string(m.Data), `"`+subj+`"`) {
				n++
			}
		}
		return n
	}
}
