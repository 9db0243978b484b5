package receipt_test

import (
	"context"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/paltest/testenv"
	"github.com/palrun/pal/receipt"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// Signers racing over one ended run (the worker and sweeps, with keys
// from before and after a rotation) leave one receipt, and every one of
// them returns it.
func TestEnsureStoresOneReceiptPerRun(t *testing.T) {
	t.Parallel()
	s := paltest.New(t)
	s.Worker(t, "w1")
	id := s.Start(t, paltest.EchoChain(3), `{}`)
	require.Equal(t, event.RunSucceeded, s.WaitEnd(t, id).Kind)

	ctx := context.Background()
	rs, err := receipt.Open(ctx, s.JS, s.Store)
	require.NoError(t, err)
	_, err = rs.Get(ctx, id)
	require.ErrorIs(t, err, receipt.ErrNotFound, "the in-process worker has no key")

	keys := []*receipt.Key{}
	for _, name := range []string{"a.key", "b.key"} {
		k, err := receipt.WriteKey(filepath.Join(t.TempDir(), name))
		require.NoError(t, err)
		keys = append(keys, k)
	}
	got := make([]*receipt.Receipt, 8)
	var wg sync.WaitGroup
	for i := range got {
		wg.Go(func() {
			r, err := rs.Ensure(ctx, keys[i%2], id)
			require.NoError(t, err)
			got[i] = r
		})
	}
	wg.Wait()
	for _, r := range got[1:] {
		require.Equal(t, got[0].Signature, r.Signature, "one receipt")
	}
	e, err := rs.KV().Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, uint64(1), e.Revision())

	var msgs [][]byte
	require.NoError(t, s.Store.Scan(ctx, id, 0, 0, func(_ uint64, b []byte) { msgs = append(msgs, append([]byte(nil), b...)) }))
	pubs := []receipt.PublicKey{keys[0].PublicKey, keys[1].PublicKey}
	require.NoError(t, receipt.Verify(got[0], pubs, msgs))
	require.Equal(t, uint64(len(msgs)), uint64(got[0].Messages))

	// A run that has not ended has no receipt to sign.
	open := s.Start(t, `{"name":"gate","nodes":[{"id":"start","type":"trigger"},{"id":"ok","type":"approval","data":{}}],
		"edges":[{"from":"start","to":"ok"}]}`, `{}`)
	s.WaitFor(t, open, "the wait", func(ev event.Event) bool { return ev.Kind == event.StepWaiting })
	_, err = rs.Ensure(ctx, keys[0], open)
	require.ErrorIs(t, err, receipt.ErrNotEnded)
	_, err = rs.KV().Get(ctx, open)
	require.Error(t, err)
}
