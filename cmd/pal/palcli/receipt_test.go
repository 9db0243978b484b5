package palcli_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/eventstore/natsauth"
	"github.com/palrun/pal/paltest/testenv"
	"github.com/palrun/pal/receipt"
)

// Signed receipts end to end, every part its own process with its NATS
// role: a worker signs the runs it ends; a run that ended with no receipt
// (its worker had no key, as after a crash between the terminal event and
// the put) is signed by the next worker's recovery sweep; the projector
// fills run_receipts; pal server serves the receipt and the keys; and pal
// receipt verify checks an export offline: it passes untouched, names the
// seq of a one-byte change, and fails with the wrong key.
func TestSignedReceiptsWithRoles(t *testing.T) {
	t.Parallel()
	bin := testenv.PalBinary(t)
	nats := testenv.NATS(t, testenv.Roles())
	pg := testenv.Postgres(t)
	dir := t.TempDir()
	creds := func(r natsauth.Role) string { return roleCreds(t, nats, dir, r) }
	key, err := receipt.WriteKey(filepath.Join(dir, "pal.key"))
	require.NoError(t, err)
	_, err = receipt.WriteKey(filepath.Join(dir, "other.key"))
	require.NoError(t, err)
	common := []string{"PAL_NATS_URL=" + nats.URL(), "DATABASE_URL=" + pg.DSN(), "PAL_DATA_DIR=" + dir}
	signing := "PAL_SIGNING_KEY=" + filepath.Join(dir, "pal.key")
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()

	w0 := testenv.StartProcess(t, bin, []string{"worker", "--worker-id", "w0"}, append(common, creds(natsauth.Worker)))
	require.NoError(t, w0.WaitForOutput(ctx, "worker ready"), w0.Output())
	proj := testenv.StartProcess(t, bin, []string{"projector"}, append(common, creds(natsauth.Projector)))
	require.NoError(t, proj.WaitForOutput(ctx, "projector ready"), proj.Output())
	port := testenv.FreePort(t)
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	srv := testenv.StartProcess(t, bin, []string{"server"}, append(common, creds(natsauth.API), signing,
		fmt.Sprintf("PAL_HTTP_ADDR=127.0.0.1:%d", port), "PAL_API_TOKENS=ci=secret-1"))
	require.NoError(t, srv.WaitForOutput(ctx, `msg="server ready"`), srv.Output())
	call := func(method, path, body string) (int, string) {
		req, err := http.NewRequestWithContext(ctx, method, url+path, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer secret-1")
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		return res.StatusCode, string(b)
	}
	wf := `{"name":"chain","nodes":[{"id":"start","type":"trigger"},
		{"id":"t1","type":"tool","data":{"tool":"echo","input":{"i":1}}},
		{"id":"t2","type":"tool","data":{"tool":"echo","input":{"i":2}}}],
		"edges":[{"from":"start","to":"t1"},{"from":"t1","to":"t2"}]}`
	start := func() string {
		code, body := call(http.MethodPost, "/v1/runs", `{"workflow":`+wf+`,"input":{}}`)
		require.Equal(t, http.StatusCreated, code, body)
		return decodeJSON[map[string]any](t, body)["run_id"].(string)
	}
	db, err := pgx.Connect(ctx, pg.DSN())
	require.NoError(t, err)
	defer db.Close(context.Background())
	projected := func(id string) bool {
		var n int
		require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM run_receipts WHERE run_id = $1`, id).Scan(&n))
		return n == 1
	}

	// A run ended by a worker with no key (w0, first: a worker sets up the
	// streams): no receipt.
	unsigned := start()
	require.Eventually(t, func() bool {
		code, body := call(http.MethodGet, "/v1/runs?status=succeeded", "")
		return code == 200 && strings.Contains(body, unsigned)
	}, 30*time.Second, 50*time.Millisecond)
	code, body := call(http.MethodGet, "/v1/runs/"+unsigned+"/receipt", "")
	require.Equal(t, http.StatusNotFound, code, body)
	require.Contains(t, body, "has ended but is not signed yet")
	require.NoError(t, w0.Term())
	require.NoError(t, w0.Wait(ctx))

	// A worker with the key: it signs what it ends, and its sweep signs
	// the run left unsigned.
	w1 := testenv.StartProcess(t, bin, []string{"worker", "--worker-id", "w1"}, append(common, creds(natsauth.Worker), signing,
		"PAL_RECOVERY_INTERVAL=1s"))
	require.NoError(t, w1.WaitForOutput(ctx, "worker ready"), w1.Output())
	signed := start()
	for _, id := range []string{signed, unsigned} {
		require.Eventually(t, func() bool { return projected(id) }, 30*time.Second, 50*time.Millisecond,
			"run %s's receipt in run_receipts:\n%s", id, w1.Output())
	}
	// The sweep logs once it has signed every run it found: the receipt
	// may be projected before the line is written.
	require.NoError(t, w1.WaitForOutput(ctx, "recovery sweep signed missing run receipts"), w1.Output())

	// The pal commands act as the worker, as under pal dev (dev.env).
	client := append(common, creds(natsauth.Worker))
	for _, id := range []string{signed, unsigned} {
		rpath := filepath.Join(dir, id+".receipt.json")
		r := runPal(t, bin, client, "run", "receipt", id, "-o", rpath)
		require.Equal(t, 0, r.code, "%s", r)
		rec, err := os.ReadFile(rpath)
		require.NoError(t, err)
		got := decodeJSON[map[string]any](t, string(rec))
		require.Equal(t, id, got["run_id"])
		require.Equal(t, key.ID, got["key_id"])
		require.Equal(t, "succeeded", got["status"])
		code, body := call(http.MethodGet, "/v1/runs/"+id+"/receipt", "")
		require.Equal(t, http.StatusOK, code, body)
		require.Equal(t, got, decodeJSON[map[string]any](t, body), "REST and the CLI serve the same receipt")

		r = runPal(t, bin, client, "run", "export", id)
		require.Equal(t, 0, r.code, "%s", r)
		journal := filepath.Join(dir, id+".jsonl")
		require.NoError(t, os.WriteFile(journal, []byte(r.stdout), 0o644))
		pub := filepath.Join(dir, "pal.pub")

		// Untouched: it verifies, offline (no NATS in the environment).
		r = runPal(t, bin, nil, "receipt", "verify", rpath, "--journal", journal, "--pubkey", pub)
		require.Equal(t, 0, r.code, "%s", r)
		require.Contains(t, r.stdout, "matches")

		// One byte of seq 3's event changed: exit 1, naming seq 3.
		jl := strings.Split(strings.TrimSuffix(string(mustRead(t, journal)), "\n"), "\n")
		i := strings.Index(jl[2], `"ts":"20`)
		require.Positive(t, i)
		jl[2] = jl[2][:i+6] + "3" + jl[2][i+7:]
		changed := filepath.Join(dir, id+".changed.jsonl")
		require.NoError(t, os.WriteFile(changed, []byte(strings.Join(jl, "\n")+"\n"), 0o644))
		r = runPal(t, bin, nil, "receipt", "verify", rpath, "--journal", changed, "--pubkey", pub)
		require.Equal(t, 1, r.code, "%s", r)
		require.Contains(t, r.stderr, "receipt does not match at seq 3")

		// The wrong key: exit 1.
		r = runPal(t, bin, nil, "receipt", "verify", rpath, "--journal", journal, "--pubkey", filepath.Join(dir, "other.pub"))
		require.Equal(t, 1, r.code, "%s", r)
		require.Contains(t, r.stderr, "not among the public keys")
	}

	code, body = call(http.MethodGet, "/v1/keys", "")
	require.Equal(t, http.StatusOK, code, body)
	keys := decodeJSON[map[string][]map[string]any](t, body)["keys"]
	require.Len(t, keys, 1)
	require.Equal(t, key.ID, keys[0]["id"])
	require.Equal(t, "Ed25519", keys[0]["alg"])
	require.NotEmpty(t, keys[0]["public_key"])

	for name, p := range map[string]*testenv.Process{"w1": w1, "projector": proj, "server": srv} {
		require.NotContains(t, p.Output(), "NATS error", "%s was refused something", name)
		require.NotContains(t, strings.ToLower(p.Output()), "permissions violation", name)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b
}
