package receipt_test

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/receipt"
)

// journal writes a run's messages as the event store would: seq from 1,
// each message's prev the hash of the one before.
func journal(t *testing.T, runID string, evs ...event.Event) [][]byte {
	t.Helper()
	var out [][]byte
	prev := ""
	ts := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for i := range evs {
		ev := evs[i]
		ev.RunID, ev.Seq, ev.Prev, ev.TS = runID, uint64(i+1), prev, ts.Add(time.Duration(i)*time.Second)
		if ev.WorkerID == "" {
			ev.WorkerID = "w1"
		}
		b, err := event.Encode(ev)
		require.NoError(t, err)
		out = append(out, b)
		prev = event.Hash(b)
	}
	return out
}

func sampleJournal(t *testing.T) [][]byte {
	usage := &event.Usage{InputTokens: 10, OutputTokens: 5, TotalTokens: 15, CostUSD: 0.0125}
	return journal(t, "run1",
		event.MustNew(event.RunCreated, "", 0, event.RunCreatedData{WorkflowName: "triage", Input: json.RawMessage(`{}`)}),
		event.MustNew(event.RunResumed, "", 0, event.RunResumedData{Worker: "w1", ResumeCount: 1}),
		event.MustNew(event.StepStarted, "s1", 1, event.StepStartedData{NodeID: "s1", NodeType: "ai-step", IdempotencyKey: "k"}),
		event.MustNew(event.StepCompleted, "s1", 1, event.StepCompletedData{Output: json.RawMessage(`{"text":"hello"}`), Usage: usage}),
		event.MustNew(event.StepStarted, "s2", 1, event.StepStartedData{NodeID: "s2", NodeType: "ai-step", IdempotencyKey: "k2"}),
		event.MustNew(event.StepCompleted, "s2", 1, event.StepCompletedData{Output: json.RawMessage(`{"text":"again"}`), Usage: usage}),
		event.MustNew(event.RunSucceeded, "", 0, event.RunSucceededData{Output: json.RawMessage(`{"ok":true}`)}),
	)
}

func newKey(t *testing.T) *receipt.Key {
	t.Helper()
	k, err := receipt.WriteKey(filepath.Join(t.TempDir(), "pal.key"))
	require.NoError(t, err)
	return k
}

func signed(t *testing.T, k *receipt.Key, msgs [][]byte) *receipt.Receipt {
	t.Helper()
	r, err := receipt.Build("run1", msgs)
	require.NoError(t, err)
	require.NoError(t, k.Sign(r, time.Now()))
	return r
}

func TestReceiptCoversTheJournal(t *testing.T) {
	t.Parallel()
	msgs := sampleJournal(t)
	k := newKey(t)
	r := signed(t, k, msgs)
	require.Equal(t, "triage", r.Workflow)
	require.Equal(t, "succeeded", r.Status)
	require.Equal(t, event.RunSucceeded, r.TerminalKind)
	require.Equal(t, uint64(1), r.FirstSeq)
	require.Equal(t, uint64(7), r.LastSeq)
	require.Equal(t, 7, r.Events)
	require.Equal(t, event.Hash(msgs[6]), r.JournalDigest)
	require.Equal(t, r.JournalDigest, r.TerminalEventHash)
	require.Equal(t, int64(20), r.InputTokens)
	require.Equal(t, "0.025000", r.CostUSD)
	require.Len(t, r.KeyID, 16)

	// Through JSON, as pal run receipt writes it and verify reads it.
	b, err := json.Marshal(r)
	require.NoError(t, err)
	back, err := receipt.Decode(b)
	require.NoError(t, err)
	require.NoError(t, receipt.Verify(back, []receipt.PublicKey{k.PublicKey}, msgs))
}

func TestOneChangedByteNamesItsSeq(t *testing.T) {
	t.Parallel()
	msgs := sampleJournal(t)
	k := newKey(t)
	r := signed(t, k, msgs)
	for seq := 1; seq <= len(msgs); seq++ {
		bad := make([][]byte, len(msgs))
		copy(bad, msgs)
		b := bytes.Clone(msgs[seq-1])
		// Change one byte of the event's timestamp: the event still
		// decodes, only its bytes differ from the chained ones.
		i := bytes.Index(b, []byte(`"ts":"2026-`)) + len(`"ts":"202`)
		b[i] = '7'
		bad[seq-1] = b
		err := receipt.Verify(r, []receipt.PublicKey{k.PublicKey}, bad)
		var ve *receipt.VerifyError
		require.ErrorAs(t, err, &ve, "seq %d", seq)
		require.Equal(t, uint64(seq), ve.Seq, "seq %d: %v", seq, err)
	}
	// A byte that breaks the JSON is named too.
	bad := append([][]byte(nil), msgs...)
	bad[2] = append(bytes.Clone(msgs[2][:len(msgs[2])-1]), '!')
	var ve *receipt.VerifyError
	require.ErrorAs(t, receipt.Verify(r, []receipt.PublicKey{k.PublicKey}, bad), &ve)
	require.Equal(t, uint64(3), ve.Seq)
	// A cut journal does not match either.
	require.ErrorAs(t, receipt.Verify(r, []receipt.PublicKey{k.PublicKey}, msgs[:6]), &ve)
}

func TestWrongKeyAndChangedReceiptFail(t *testing.T) {
	t.Parallel()
	msgs := sampleJournal(t)
	k, other := newKey(t), newKey(t)
	r := signed(t, k, msgs)

	err := receipt.Verify(r, []receipt.PublicKey{other.PublicKey}, msgs)
	require.ErrorContains(t, err, "not among the public keys")
	// The right id with another key's bytes: the signature fails.
	err = receipt.Verify(r, []receipt.PublicKey{{ID: k.ID, Public: other.Public}}, msgs)
	require.ErrorContains(t, err, "signature does not verify")

	changed := *r
	changed.CostUSD = "0.000000"
	require.ErrorContains(t, receipt.Verify(&changed, []receipt.PublicKey{k.PublicKey}, msgs), "signature does not verify")
}

func TestRotatedKeysStillVerify(t *testing.T) {
	t.Parallel()
	msgs := sampleJournal(t)
	dir := t.TempDir()
	oldKey, err := receipt.WriteKey(filepath.Join(dir, "old.key"))
	require.NoError(t, err)
	r := signed(t, oldKey, msgs)
	_, err = receipt.WriteKey(filepath.Join(dir, "new.key"))
	require.NoError(t, err)

	env := map[string]string{receipt.EnvSigningKey: filepath.Join(dir, "new.key"), receipt.EnvOldKeys: filepath.Join(dir, "old.pub")}
	ks, err := receipt.LoadKeys(func(k string) string { return env[k] })
	require.NoError(t, err)
	require.Len(t, ks.Public(), 2)
	require.NotEqual(t, oldKey.ID, ks.Current.ID)
	require.NoError(t, receipt.Verify(r, ks.Public(), msgs), "a receipt of the retired key verifies with the served keys")
	docs := ks.Docs()
	require.True(t, docs[0].Current)
	require.Equal(t, oldKey.ID, docs[1].ID)
	require.Equal(t, "Ed25519", docs[1].Alg)

	pub, err := receipt.LoadPublicKey(filepath.Join(dir, "old.pub"))
	require.NoError(t, err)
	require.Equal(t, oldKey.ID, pub.ID)
	require.Equal(t, ed25519.PublicKey(oldKey.Public), pub.Public)

	_, err = receipt.LoadKey(filepath.Join(dir, "old.pub"))
	require.ErrorContains(t, err, `not a PEM "PRIVATE KEY" block`)
	_, err = receipt.LoadKeys(func(k string) string { return map[string]string{receipt.EnvOldKeys: "x"}[k] })
	require.Error(t, err)
}

func TestUnfinishedJournalHasNoReceipt(t *testing.T) {
	t.Parallel()
	msgs := sampleJournal(t)
	_, err := receipt.Build("run1", msgs[:5])
	require.ErrorIs(t, err, receipt.ErrNotEnded)
}
