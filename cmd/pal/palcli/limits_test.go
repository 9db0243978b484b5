package palcli_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/paltest/testenv"
)

// TestServerLimits: pal server holds each caller to PAL_LIMIT_*: a token
// past its starts gets 429 with Retry-After while another token starts,
// the NATS service shares the process's limiter, a token at its open
// streams is refused one more, and failed logins trip their bound. Bad
// limit settings stop the process, naming the variable.
func TestServerLimits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for env, msg := range map[string]string{
		"PAL_LIMIT_STARTS=fast":         `PAL_LIMIT_STARTS: "fast": want N/unit`,
		"PAL_LIMIT_COMMANDS=0/s":        `PAL_LIMIT_COMMANDS: "0/s": the count must be a whole number`,
		"PAL_LIMIT_STREAMS=5/s:0":       `PAL_LIMIT_STREAMS: "5/s:0": the burst must be a whole number`,
		"PAL_LIMIT_OPEN_STREAMS=-1":     `PAL_LIMIT_OPEN_STREAMS="-1": want a whole number ≥ 0`,
		"PAL_LIMIT_LOGIN_FAILURES=off":  `PAL_LIMIT_LOGIN_FAILURES="off": want a rate of failures such as 10/m (it cannot be off)`,
		"PAL_LIMIT_LOGIN_FAILURES=lots": `PAL_LIMIT_LOGIN_FAILURES="lots"`,
	} {
		r := b.pal(t, []string{"PAL_HTTP_ADDR=127.0.0.1:0", "PAL_API_TOKENS=ci=secret-1", env}, "server")
		require.Equal(t, 2, r.code, "%s: %s", env, r)
		require.Contains(t, r.stderr, msg, env)
	}

	port := testenv.FreePort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	srv := testenv.StartProcess(t, b.bin, []string{"server"}, []string{"PAL_NATS_URL=" + b.NATS.URL(),
		fmt.Sprintf("PAL_HTTP_ADDR=127.0.0.1:%d", port), "PAL_API_TOKENS=ci=secret-1,ops=secret-2",
		"PAL_LIMIT_STARTS=1/h:3", "PAL_LIMIT_OPEN_STREAMS=1", "PAL_LIMIT_LOGIN_FAILURES=1/h:2"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, srv.WaitForOutput(ctx, `msg="server ready"`), srv.Output())

	do := func(method, path, token, body string) *http.Response {
		req, err := http.NewRequest(method, base+path, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+token)
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		return res
	}
	// Runs that wait for an approval: their streams stay open.
	start := `{"workflow":{"name":"gate","nodes":[{"id":"start","type":"trigger"},{"id":"ok","type":"approval","data":{}}],` +
		`"edges":[{"from":"start","to":"ok"}]}}`
	var id string
	for range 3 {
		res := do(http.MethodPost, "/v1/runs", "secret-1", start)
		res.Body.Close()
		require.Equal(t, http.StatusCreated, res.StatusCode)
		id = strings.TrimPrefix(res.Header.Get("Location"), "/v1/runs/")
	}
	res := do(http.MethodPost, "/v1/runs", "secret-1", start)
	res.Body.Close()
	require.Equal(t, http.StatusTooManyRequests, res.StatusCode)
	require.NotEmpty(t, res.Header.Get("Retry-After"))
	res = do(http.MethodPost, "/v1/runs", "secret-2", start)
	res.Body.Close()
	require.Equal(t, http.StatusCreated, res.StatusCode, "another token")

	// The NATS service: its callers (one, "pal.api", until NATS users
	// carry identities) share the same limits.
	limited := false
	for range 4 {
		m, err := b.NC.Request("pal.api.runs.start", []byte(start), 10*time.Second)
		require.NoError(t, err)
		if m.Header.Get(micro.ErrorCodeHeader) == "429" {
			limited = true
		}
	}
	require.True(t, limited, "the NATS service's fourth start is refused")

	// One open stream per token.
	stream := do(http.MethodGet, "/v1/runs/"+id+"/events", "secret-1", "")
	defer stream.Body.Close()
	require.Equal(t, http.StatusOK, stream.StatusCode)
	res = do(http.MethodGet, "/v1/runs/"+id+"/events", "secret-1", "")
	res.Body.Close()
	require.Equal(t, http.StatusTooManyRequests, res.StatusCode)

	// Two failed logins, then even the right token is refused from here.
	login := func(token string) int {
		c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		res, err := c.PostForm(base+"/login", url.Values{"token": {token}})
		require.NoError(t, err)
		res.Body.Close()
		return res.StatusCode
	}
	require.Equal(t, http.StatusUnauthorized, login("wrong-1-0123456789"))
	require.Equal(t, http.StatusUnauthorized, login("wrong-2-0123456789"))
	require.Equal(t, http.StatusTooManyRequests, login("secret-1"))

	require.NoError(t, srv.Term())
	require.NoError(t, srv.Wait(ctx), srv.Output())
}
