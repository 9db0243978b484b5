package palcli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/api"
	"github.com/palrun/pal/paltest/testenv"
)

func TestServer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.start(t, seqWorkflow(1), `{"text":"served"}`)
	b.WaitEnd(t, id)

	// No tokens, no --insecure-no-auth: it serves, refuses every /v1
	// request, and says why.
	{
		port := testenv.FreePort(t)
		url := fmt.Sprintf("http://127.0.0.1:%d", port)
		p := testenv.StartProcess(t, b.bin, []string{"server"}, []string{"PAL_NATS_URL=" + b.NATS.URL(), fmt.Sprintf("PAL_HTTP_ADDR=127.0.0.1:%d", port)})
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		require.NoError(t, p.WaitForOutput(ctx, `msg="server ready"`), p.Output())
		cancel()
		require.Contains(t, p.Output(), "PAL_API_TOKENS is not set: every /v1 request will be refused (401)")
		require.Contains(t, p.Output(), "--insecure-no-auth")
		for path, want := range map[string]int{"/healthz": 200, "/v1/runs/" + id: 401} {
			res, err := http.Get(url + path)
			require.NoError(t, err)
			res.Body.Close()
			require.Equal(t, want, res.StatusCode, path)
		}
		p.Kill()
	}
	for env, msg := range map[string]string{
		"PAL_HTTP_ADDR=localhost":   "PAL_HTTP_ADDR=\"localhost\": want host:port",
		"PAL_HTTP_ADDR=example:80":  "must be an IP address or localhost",
		"PAL_API_TOKENS=a=x y":      "PAL_API_TOKENS: token 1 (a): a token cannot contain white space",
		"PAL_LOG_LEVEL=loud":        "PAL_LOG_LEVEL",
		"DATABASE_URL=postgres://%": "DATABASE_URL",
	} {
		// Valid settings but the one under test (the last of a name wins).
		r := b.pal(t, []string{"PAL_HTTP_ADDR=127.0.0.1:0", "PAL_API_TOKENS=ci=secret-1", env}, "server")
		require.Equal(t, 2, r.code, "%s: %s", env, r)
		require.Contains(t, r.stderr, msg, env)
	}

	port := testenv.FreePort(t)
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	srv := testenv.StartProcess(t, b.bin, []string{"server"}, []string{"PAL_NATS_URL=" + b.NATS.URL(),
		fmt.Sprintf("PAL_HTTP_ADDR=127.0.0.1:%d", port), "PAL_API_TOKENS=ci=secret-1,ops=secret-2"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, srv.WaitForOutput(ctx, `msg="server ready" url=`+url))
	require.Contains(t, srv.Output(), "tokens=ci,ops")

	get := func(path, token string) (int, string) {
		req, err := http.NewRequest(http.MethodGet, url+path, nil)
		require.NoError(t, err)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		body, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		return res.StatusCode, string(body)
	}
	code, _ := get("/healthz", "")
	require.Equal(t, 200, code)
	code, _ = get("/readyz", "")
	require.Equal(t, 200, code)
	code, body := get("/v1/runs/"+id, "")
	require.Equal(t, 401, code, body)
	code, body = get("/v1/runs/"+id, "secret-2")
	require.Equal(t, 200, code, body)
	require.Contains(t, body, `"status":"succeeded"`)
	code, body = get("/v1/runs", "secret-1")
	require.Equal(t, 503, code, body)
	require.JSONEq(t, `{"error":"unavailable","detail":"listing runs needs DATABASE_URL"}`, body)

	// The NATS micro service is registered too.
	m, err := b.NC.Request("$SRV.INFO.pal", nil, 5*time.Second)
	require.NoError(t, err)
	var info micro.Info
	require.NoError(t, json.Unmarshal(m.Data, &info))
	require.Equal(t, "pal", info.Name)

	require.NoError(t, srv.Term())
	require.NoError(t, srv.Wait(ctx), srv.Output())

	// --insecure-no-auth: served without tokens, and said loudly.
	port = testenv.FreePort(t)
	url = fmt.Sprintf("http://127.0.0.1:%d", port)
	srv = testenv.StartProcess(t, b.bin, []string{"server", "--insecure-no-auth", "--http-addr", fmt.Sprintf("127.0.0.1:%d", port)},
		[]string{"PAL_NATS_URL=" + b.NATS.URL()})
	require.NoError(t, srv.WaitForOutput(ctx, "server ready"))
	require.Contains(t, srv.Output(), "WITHOUT AUTHENTICATION")
	code, body = get("/v1/runs/"+id, "")
	require.Equal(t, 200, code, body)
	require.NoError(t, srv.Term())
	require.NoError(t, srv.Wait(ctx), srv.Output())
}

// TestServerHelpListsRoutes: pal server --help lists every route of the
// REST API, from the one list the handler serves.
func TestServerHelpListsRoutes(t *testing.T) {
	t.Parallel()
	r := runPal(t, testenv.PalBinary(t), nil, "server", "--help")
	require.Equal(t, 0, r.code, "%s", r)
	require.Contains(t, r.stdout, api.FormatRoutes(api.Routes(), "  "))
}
