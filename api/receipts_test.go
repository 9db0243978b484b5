package api_test

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/api"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/receipt"
)

// TestReceiptServedOnlyWhenPALs: GET /v1/runs/{id}/receipt serves a
// stored receipt only when its signature verifies against the server's
// keys and it is the run's own; anything else stored under the run's key
// (a value that is no receipt, one signed by another key, another run's
// receipt) is refused as receipt_invalid, never 200 with it; and a server
// with no keys to check with says so.
func TestReceiptServedOnlyWhenPALs(t *testing.T) {
	newKey := func() *receipt.Key {
		_, priv, err := ed25519.GenerateKey(nil)
		require.NoError(t, err)
		return receipt.NewKey(priv)
	}
	pal, other := newKey(), newKey()
	b := setup(t, withHandler(func(c *api.HandlerConfig) { c.Keys = &receipt.Keys{Current: pal} }))
	ctx := context.Background()
	kv, err := b.JS.KeyValue(ctx, eventstore.ReceiptBucket)
	require.NoError(t, err)
	signed := func(runID string, k *receipt.Key) []byte {
		r := &receipt.Receipt{V: receipt.Version, RunID: runID, Workflow: "w", Status: "succeeded", TerminalKind: "run_succeeded",
			TerminalSeq: 3, FirstSeq: 1, LastSeq: 3, Events: 3, Messages: 3, CostUSD: "0.000000"}
		require.NoError(t, k.Sign(r, time.Now()))
		b, err := json.Marshal(r)
		require.NoError(t, err)
		return b
	}
	put := func(key string, v []byte) {
		_, err := kv.Put(ctx, key, v)
		require.NoError(t, err)
	}
	put("run_good", signed("run_good", pal))
	put("run_blank", []byte(`{"stream":"PAL_CMDS","seq":3}`))
	put("run_other", signed("run_other", other))
	put("run_copy", signed("run_good", pal))

	res := b.get(t, "/v1/runs/run_good/receipt")
	require.Equal(t, http.StatusOK, res.status, "%s", res.body)
	require.Equal(t, "run_good", res.json(t)["run_id"])
	for id, why := range map[string]string{
		"run_blank": "not among the public keys",
		"run_other": "not among the public keys",
		"run_copy":  "another run's",
	} {
		res := b.get(t, "/v1/runs/"+id+"/receipt")
		require.Equal(t, http.StatusInternalServerError, res.status, "%s: %s", id, res.body)
		body := res.json(t)
		require.Equal(t, "receipt_invalid", body["error"], "%s", id)
		require.Contains(t, body["detail"], why, "%s", id)
	}

	// A server without keys serves nothing it cannot check.
	nokeys := setup(t)
	kv2, err := nokeys.JS.KeyValue(ctx, eventstore.ReceiptBucket)
	require.NoError(t, err)
	_, err = kv2.Put(ctx, "run_good", signed("run_good", pal))
	require.NoError(t, err)
	res = nokeys.get(t, "/v1/runs/run_good/receipt")
	require.Equal(t, http.StatusServiceUnavailable, res.status, "%s", res.body)
	require.Contains(t, res.json(t)["detail"], "PAL_SIGNING_KEY")
}
