package natsauth_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/eventstore/natsauth"
	"github.com/palrun/pal/paltest/testenv"
	"github.com/palrun/pal/receipt"
	"github.com/palrun/pal/runs"
)

// seen collects what PAL's account receives on some subjects.
type seen struct {
	mu   sync.Mutex
	msgs map[string][]*nats.Msg
}

func (s *seen) watch(t *testing.T, nc *nats.Conn, subjects ...string) {
	t.Helper()
	for _, subj := range subjects {
		_, err := nc.Subscribe(subj, func(m *nats.Msg) {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.msgs[subj] = append(s.msgs[subj], m)
		})
		require.NoError(t, err)
	}
	require.NoError(t, nc.Flush())
}

func (s *seen) on(subj string) []*nats.Msg {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*nats.Msg(nil), s.msgs[subj]...)
}

// journalKinds lists the kinds of a run's journal, read by the admin.
func (b *bundle) journalKinds(t *testing.T, runID string) []event.Kind {
	t.Helper()
	return testenv.ReadJournal(t, b.admin).Kinds(runID)
}

// TestDeputies replays, from the client account, every responder of
// PAL's account that a request could aim at PAL's subjects with its reply
// subject: the service's discovery ($SRV.PING, INFO, STATS) and an
// endpoint, the JetStream API (stream and account info, message get,
// Direct Get on the journal, the leases, the receipts and the big
// values), a durable command whose JetStream ack goes to the reply, and a
// consumer create through the guard. Each is sent with its reply aimed at
// a finished run's journal, a waiting run's journal, a held lease and a
// signed receipt, and once more with a reply of the client's own, which
// is answered: the responders work, but across the import the server
// answers on a reply subject of its own that leads back to the client
// account. Nothing lands on PAL's subjects: the journal, the receipts and
// the blobs are as they were, the lease is only ever its worker's, the
// waiting run still waits, the driven run ends as it would, and the
// receipt is the one PAL signed.
func TestDeputies(t *testing.T) {
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	big := b.start(t, bigWF) // a big output: PAL_BLOBS holds a chunk
	b.waitStatus(t, big, "succeeded")
	done := b.start(t, echoWF)
	b.waitStatus(t, done, "succeeded")
	var signed receipt.Receipt
	rkv, err := b.cjs.KeyValue(ctx, eventstore.ReceiptBucket)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		r, err := b.receipts.Get(ctx, done)
		if err == nil {
			signed = *r
		}
		return err == nil
	}, 30*time.Second, 10*time.Millisecond, "the worker never signed the receipt")
	gate := b.start(t, approvalWF)
	b.waitStatus(t, gate, "waiting")
	slow := b.start(t, slowWF)
	<-b.slowStarted
	holder, err := b.store.JetStream().KeyValue(ctx, eventstore.LeaseBucket)
	require.NoError(t, err)
	lease, err := holder.Get(ctx, slow)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(lease.Value()), "w1/"))

	js, err := jetstream.New(b.admin)
	require.NoError(t, err)
	lastSeq := func(stream string) uint64 {
		info, err := js.Stream(ctx, stream)
		require.NoError(t, err)
		return info.CachedInfo().State.LastSeq
	}
	unchanged := []string{eventstore.EventsStream, "KV_" + eventstore.ReceiptBucket, eventstore.BlobStream,
		eventstore.DeadStream, eventstore.TimersStream, eventstore.BlobRefsStream}
	before := map[string]uint64{}
	for _, s := range unchanged {
		before[s] = lastSeq(s)
	}
	cmdsBefore := lastSeq(eventstore.CommandsStream)
	kinds := map[string][]string{}
	for _, id := range []string{done, gate, slow} {
		for _, k := range b.journalKinds(t, id) {
			kinds[id] = append(kinds[id], string(k))
		}
	}

	leaseSubj := "$KV." + eventstore.LeaseBucket + "." + slow
	receiptSubj := "$KV." + eventstore.ReceiptBucket + "." + done
	targets := []string{eventstore.EventsSubject(done), eventstore.EventsSubject(gate), leaseSubj, receiptSubj}
	palSeen := &seen{msgs: map[string][]*nats.Msg{}}
	palSeen.watch(t, b.admin, targets...)

	js1 := func(v any) []byte { b, _ := json.Marshal(v); return b }
	type deputy struct {
		subject string
		body    []byte
	}
	n := 0
	createPull := func() deputy {
		n++
		name := fmt.Sprintf("deputy%d", n)
		return deputy{"$JS.API.CONSUMER.CREATE." + eventstore.EventsStream + "." + name,
			js1(map[string]any{"stream_name": eventstore.EventsStream, "config": map[string]any{"name": name, "ack_policy": "none",
				"inactive_threshold": int64(time.Minute)}, "action": "create"})}
	}
	deputies := func() []deputy {
		return []deputy{
			{"$SRV.PING", nil}, {"$SRV.PING.pal", nil}, {"$SRV.INFO.pal", nil}, {"$SRV.STATS.pal", nil},
			{"pal.api.runs.get", js1(map[string]string{"run_id": done})},
			{"$JS.API.INFO", nil},
			{"$JS.API.STREAM.INFO." + eventstore.EventsStream, nil},
			{"$JS.API.STREAM.MSG.GET." + eventstore.EventsStream, js1(map[string]any{"last_by_subj": eventstore.EventsSubject(done)})},
			{"$JS.API.DIRECT.GET." + eventstore.EventsStream, js1(map[string]any{"last_by_subj": eventstore.EventsSubject(done)})},
			{"$JS.API.DIRECT.GET." + eventstore.EventsStream, js1(map[string]any{"seq": 1, "next_by_subj": eventstore.EventsSubject(gate), "batch": 10})},
			{"$JS.API.DIRECT.GET." + eventstore.BlobStream, js1(map[string]any{"seq": 1})},
			{"$JS.API.DIRECT.GET.KV_" + eventstore.LeaseBucket, js1(map[string]any{"last_by_subj": leaseSubj})},
			{"$JS.API.DIRECT.GET.KV_" + eventstore.ReceiptBucket, js1(map[string]any{"last_by_subj": receiptSubj})},
			createPull(),
		}
	}
	// Each deputy with its reply aimed at PAL's subjects, then with one
	// of the client's own, which is answered.
	for _, target := range targets {
		for _, d := range deputies() {
			require.NoError(t, b.client.PublishRequest(d.subject, target, d.body))
		}
		// A durable command: its JetStream ack goes to the reply.
		require.NoError(t, b.client.PublishRequest(natsauth.CommandSubject(runs.CmdCancel, natsauth.DefaultUser), target,
			js1(map[string]string{"run_id": "run_nobody"})))
	}
	for _, d := range deputies() {
		m, err := b.client.RequestWithContext(ctx, d.subject, d.body)
		require.NoError(t, err, "%s is answered on the client's own reply", d.subject)
		require.NotEmpty(t, m.Data, d.subject)
	}
	ack, err := b.cjs.Publish(ctx, natsauth.CommandSubject(runs.CmdCancel, natsauth.DefaultUser), js1(map[string]string{"run_id": "run_nobody"}))
	require.NoError(t, err)
	require.Equal(t, eventstore.CommandsStream, ack.Stream)
	require.NoError(t, b.client.Flush())
	require.NoError(t, b.admin.Flush())

	// The durable commands were stored (one per target and the last),
	// and nothing else anywhere.
	require.Equal(t, cmdsBefore+uint64(len(targets))+1, lastSeq(eventstore.CommandsStream))
	for _, s := range unchanged {
		require.Equal(t, before[s], lastSeq(s), "stream %s took a message", s)
	}
	for _, target := range targets[:2] {
		require.Empty(t, palSeen.on(target), "a reply landed on %s", target)
	}
	require.Empty(t, palSeen.on(receiptSubj), "a reply landed on the receipt")
	for _, m := range palSeen.on(leaseSubj) {
		require.True(t, strings.HasPrefix(string(m.Data), "w1/") || len(m.Data) == 0, "the lease took %q", m.Data)
	}
	v, err := b.runs.Get(ctx, gate)
	require.NoError(t, err)
	require.Equal(t, "waiting", string(v.Status))
	close(b.slowRelease)
	b.waitStatus(t, slow, "succeeded")
	for _, id := range []string{done, gate} {
		var got []string
		for _, k := range b.journalKinds(t, id) {
			got = append(got, string(k))
		}
		require.Equal(t, kinds[id], got, "the journal of %s", id)
	}
	e, err := rkv.Get(ctx, done)
	require.NoError(t, err)
	stored, err := receipt.Decode(e.Value())
	require.NoError(t, err)
	require.Equal(t, signed, *stored)
	require.NoError(t, receipt.VerifySignature(stored, b.keys.Public()))
	require.NoError(t, b.client.Flush())
	require.Empty(t, b.cviol.all())
}

// forgeNext is the next message of runID's journal as PAL would write it,
// by admin's reading: an approval of step ok by ana, chained and numbered.
func (b *bundle) forgeNext(t *testing.T, runID string) ([]byte, uint64) {
	t.Helper()
	ctx := context.Background()
	head, err := b.store.LastHead(ctx, runID)
	require.NoError(t, err)
	ev := event.MustNew(event.ApprovalReceived, "ok", 0, event.ApprovalReceivedData{Decision: "approve", Approver: ana})
	ev.V, ev.RunID, ev.Seq, ev.Prev, ev.WorkerID, ev.TS = event.Version, runID, head.Seq+1, head.Hash, ana, time.Now().UTC()
	body, err := event.Encode(ev)
	require.NoError(t, err)
	return body, ev.Seq
}

// TestForgedMessageSealsJournal: a message in a journal that PAL did not
// write is never folded, however sound its bytes: one an admin (who can
// still write there) forged without PAL's headers, and a stored Direct
// Get answer carrying PAL's very headers, both seal their run
// journal_corrupt at that seq, read by the approval that finds it, and
// the projection shows it failed.
func TestForgedMessageSealsJournal(t *testing.T) {
	b := setupWith(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ajs, err := jetstream.New(b.admin)
	require.NoError(t, err)
	byAdmin, answer := b.start(t, approvalWF), b.start(t, approvalWF)
	b.waitStatus(t, byAdmin, "waiting")
	b.waitStatus(t, answer, "waiting")

	body, seqAdmin := b.forgeNext(t, byAdmin)
	_, err = ajs.Publish(ctx, eventstore.EventsSubject(byAdmin), body)
	require.NoError(t, err)

	body, seqAnswer := b.forgeNext(t, answer)
	_, err = ajs.CreateStream(ctx, jetstream.StreamConfig{Name: "ELSEWHERE", Subjects: []string{"elsewhere"}, AllowDirect: true})
	require.NoError(t, err)
	hdr := nats.Header{jetstream.MsgIDHeader: []string{fmt.Sprintf("%s:%d", answer, seqAnswer)}, "Pal-Kind": []string{string(event.ApprovalReceived)}}
	pa, err := ajs.PublishMsg(ctx, &nats.Msg{Subject: "elsewhere", Data: body, Header: hdr})
	require.NoError(t, err)
	head, err := b.store.LastHead(ctx, answer)
	require.NoError(t, err)
	require.NoError(t, b.admin.PublishRequest("$JS.API.DIRECT.GET.ELSEWHERE", eventstore.EventsSubject(answer), fmt.Appendf(nil, `{"seq":%d}`, pa.Sequence)))
	require.Eventually(t, func() bool {
		h, err := b.store.LastHead(ctx, answer)
		return err == nil && h.StreamSeq > head.StreamSeq
	}, 10*time.Second, 10*time.Millisecond, "the answer never landed")

	for runID, seq := range map[string]uint64{byAdmin: seqAdmin, answer: seqAnswer} {
		err := b.runs.Approve(ctx, runs.ApproveCommand{RunID: runID, StepID: "ok", Decision: "approve", Approver: ana})
		require.ErrorIs(t, err, runs.ErrRunFinished, runID)
		b.waitStatus(t, runID, "failed")
		v, err := b.runs.Get(ctx, runID)
		require.NoError(t, err)
		require.Equal(t, event.CodeJournalCorrupt, v.ErrorCode, runID)
		evs, _, err := b.store.Read(ctx, runID)
		require.NoError(t, err, "sealed: the journal reads whole")
		last := evs[len(evs)-1]
		require.Equal(t, event.RunFailed, last.Kind)
		require.Equal(t, seq, last.Seq, "the seal takes the forged message's seq")
		var d event.RunFailedData
		require.NoError(t, last.DecodeData(&d))
		require.Equal(t, seq, d.Seq)
		require.Contains(t, d.Reason, "not a message PAL wrote")
		for _, ev := range evs {
			require.NotEqual(t, event.ApprovalReceived, ev.Kind, "%s: the forged approval was folded", runID)
		}
		require.Eventually(t, func() bool {
			var status, code *string
			err := b.pool.QueryRow(ctx, `SELECT status, error_code FROM runs WHERE run_id = $1`, runID).Scan(&status, &code)
			return err == nil && status != nil && *status == "failed" && code != nil && *code == event.CodeJournalCorrupt
		}, 30*time.Second, 20*time.Millisecond, "the projection of %s", runID)
	}
}
