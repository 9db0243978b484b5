package api_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/palrun/pal/api"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/internal/limit"
	"github.com/palrun/pal/paltest"
	palv1 "github.com/palrun/pal/proto/pal/v1"
	"github.com/palrun/pal/runs"
)

// otherToken is a second token with the default scopes, named "other".
const otherToken = "other-token-0123456789"

// withLimits gives the bundle's API the limits l on a clock that stands
// still (no bucket refills during a test, however slow the machine), and
// a second token.
func withLimits(l limit.Limits) bundleOpt {
	return func(c *bundleCfg) {
		c.tokens = append(c.tokens, api.Token{Name: "other", Secret: otherToken})
		prev := c.handler
		now := time.Now()
		c.handler = func(hc *api.HandlerConfig) {
			if prev != nil {
				prev(hc)
			}
			hc.Limiter = limit.New(l, func() time.Time { return now })
		}
	}
}

// perHour is a rate that does not refill within a test: a burst of n.
func perHour(n int) limit.Rate { return limit.Rate{N: 1, Per: time.Hour, Burst: n} }

// requireLimited checks a 429: code rate_limited, a Retry-After in whole
// seconds, and a detail that says what to do.
func requireLimited(t testing.TB, r response) {
	t.Helper()
	m := requireError(t, r, http.StatusTooManyRequests, runs.CodeRateLimited)
	secs, err := strconv.Atoi(r.header.Get("Retry-After"))
	require.NoError(t, err, "Retry-After %q", r.header.Get("Retry-After"))
	require.Positive(t, secs)
	require.Contains(t, m["detail"], "too many")
}

// TestStartFloodFromOneToken: 600 starts at once from one token under the
// default limits (500 at once, then 50 a second; the clock stands still)
// are answered 429 with Retry-After past the burst, each refused start
// writing nothing, while another token's starts go through.
func TestStartFloodFromOneToken(t *testing.T) {
	t.Parallel()
	b := setup(t, withLimits(limit.Defaults()))
	ctx := context.Background()
	body := `{"workflow":` + echoWorkflow + `}`
	const flood = 600
	var (
		mu              sync.Mutex
		created, denied int
		wg              sync.WaitGroup
		work            = make(chan struct{})
	)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range work {
				r := b.post(t, "/v1/runs", body)
				mu.Lock()
				switch r.status {
				case http.StatusCreated:
					created++
				default:
					requireLimited(t, r)
					denied++
				}
				mu.Unlock()
			}
		}()
	}
	for range flood {
		work <- struct{}{}
	}
	close(work)
	wg.Wait()
	t.Logf("%d starts from one token: %d created, %d refused (429)", flood, created, denied)
	require.Equal(t, limit.Defaults().Starts.Burst, created, "the burst goes through")
	require.Equal(t, flood-created, denied, "the rest is refused")

	r := b.post(t, "/v1/runs", body, bearerOf(otherToken)...)
	require.Equal(t, http.StatusCreated, r.status, "another token's start goes through: %s", r.body)

	events, err := b.JS.Stream(ctx, eventstore.EventsStream)
	require.NoError(t, err)
	info, err := events.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(created+1), info.State.Msgs, "one run_created per start carried out, none for the refused")
}

// TestCommandsAndStreamsAreLimited: a token's commands (approve, cancel,
// …), fork and retry (starts), the event streams it opens and those it
// holds open are each bounded; a refusal is 429 with Retry-After on REST
// and RESOURCE_EXHAUSTED on gRPC, writes nothing, and leaves other
// tokens alone; a stream that ends frees its place.
func TestCommandsAndStreamsAreLimited(t *testing.T) {
	t.Parallel()
	b := setup(t, withLimits(limit.Limits{Starts: perHour(2), Commands: perHour(2), Streams: perHour(4), OpenStreams: 2}))
	ctx := context.Background()
	gate := `{"workflow":{"name":"gate","nodes":[{"id":"start","type":"trigger"},{"id":"ok","type":"approval","data":{}}],"edges":[{"from":"start","to":"ok"}]}}`
	r := b.post(t, "/v1/runs", gate)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	id := r.json(t)["run_id"].(string)

	// Commands: two, then 429, and nothing written.
	for range 2 {
		r = b.post(t, "/v1/runs/"+id+"/signals/nothing", `{}`)
		require.NotEqual(t, http.StatusTooManyRequests, r.status, "%s", r.body)
	}
	before := b.journalState(t)
	requireLimited(t, b.post(t, "/v1/runs/"+id+"/cancel", `{}`))
	require.Equal(t, before, b.journalState(t), "a refused command writes nothing")
	r = b.post(t, "/v1/runs/"+id+"/cancel", `{}`, bearerOf(otherToken)...)
	require.Equal(t, http.StatusOK, r.status, "another token's command: %s", r.body)

	// Fork and retry spend starts: one left, then 429.
	r = b.post(t, "/v1/runs/"+id+"/retry", `{}`)
	require.NotEqual(t, http.StatusTooManyRequests, r.status, "%s", r.body)
	requireLimited(t, b.post(t, "/v1/runs/"+id+"/fork", `{"from":"ok"}`))

	// Streams (of a run in flight): two open at once; a third is refused
	// until one ends.
	id = b.Start(t, `{"name":"gate","nodes":[{"id":"start","type":"trigger"},{"id":"ok","type":"approval","data":{}}],"edges":[{"from":"start","to":"ok"}]}`, `{}`)
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	s1, err := b.openSSE(t, client, id, "")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, s1.res.StatusCode)
	defer s1.close()
	gctx, cancel := context.WithCancel(withBearer(ctx, testToken))
	defer cancel()
	g, err := b.grpcClient(t).StreamRunEvents(gctx, &palv1.StreamRunEventsRequest{RunId: id})
	require.NoError(t, err)
	_, err = g.Recv() // run_created: the stream is open
	require.NoError(t, err)
	r = b.get(t, "/v1/runs/"+id+"/events")
	requireLimited(t, r)
	require.Contains(t, r.json(t)["detail"], "too many event streams open for ci (the limit is 2 at once)")
	g2, err := b.grpcClient(t).StreamRunEvents(withBearer(ctx, testToken), &palv1.StreamRunEventsRequest{RunId: id})
	require.NoError(t, err)
	_, err = g2.Recv()
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	require.Contains(t, status.Convert(err).Message(), "too many event streams open for ci")

	// Another token opens its own: four (HEAD: each ends at once), then
	// the rate of opens is spent.
	for range 4 {
		r = b.do(t, http.MethodHead, "/v1/runs/"+id+"/events", nil, bearerOf(otherToken)...)
		require.Equal(t, http.StatusOK, r.status)
	}
	r = b.get(t, "/v1/runs/"+id+"/events", bearerOf(otherToken)...)
	requireLimited(t, r)
	require.Contains(t, r.json(t)["detail"], "too many event streams opened from other")

	// A stream that ends frees its place (refusals at the cap spent
	// nothing of the rate).
	cancel()
	require.Eventually(t, func() bool {
		return b.do(t, http.MethodHead, "/v1/runs/"+id+"/events", nil).status == http.StatusOK
	}, 10*time.Second, 5*time.Millisecond)
}

// TestNATSServiceIsLimited: the NATS service pal applies the front
// door's limits: past the burst a start is answered with the service
// error 429 and code rate_limited, and starts nothing.
func TestNATSServiceIsLimited(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	client := runs.New(b.Store, runs.WithLimiter(limit.New(limit.Limits{Starts: perHour(3)}, nil)))
	svc, err := api.StartService(ctx, b.NC, client, paltest.Logger(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = svc.Stop() })
	ok, limited := 0, 0
	for range 5 {
		m, err := b.NC.Request("pal.api.runs.start", []byte(`{"workflow":`+echoWorkflow+`}`), 10*time.Second)
		require.NoError(t, err)
		switch m.Header.Get(micro.ErrorCodeHeader) {
		case "":
			ok++
		case "429":
			require.Contains(t, string(m.Data), `"code":"rate_limited"`)
			require.Contains(t, string(m.Data), "try again in")
			limited++
		default:
			t.Fatalf("unexpected answer %s: %s", m.Header.Get(micro.ErrorCodeHeader), m.Data)
		}
	}
	require.Equal(t, 3, ok)
	require.Equal(t, 2, limited)
}

// loginFrom posts the login form from the local address ip (any of
// 127.0.0.0/8 reaches the API on 127.0.0.1) and returns the answer.
func (b *bundle) loginFrom(t testing.TB, ip, token string, headers ...string) *http.Response {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DialContext: d.DialContext},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	defer c.CloseIdleConnections()
	req, err := http.NewRequest(http.MethodPost, b.url+"/login", strings.NewReader(url.Values{"token": {token}, "next": {"/"}}.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	res, err := c.Do(req)
	require.NoError(t, err)
	_ = res.Body.Close()
	return res
}

// TestLoginFailuresAreBounded: wrong tokens from one address trip its
// bound (10): then even the right token from there is answered 429 with
// Retry-After, while it still logs in from another address. Wrong
// guesses at one token's first bytes from many addresses trip that
// prefix's bound, so the right token is refused from a fresh address too,
// while another token logs in from there.
func TestLoginFailuresAreBounded(t *testing.T) {
	t.Parallel()
	b := setup(t, withHandler(func(hc *api.HandlerConfig) { hc.LoginFailures = perHour(10) }))
	for i := range 10 {
		res := b.loginFrom(t, "127.0.0.2", fmt.Sprintf("wrong-%d-%s", i, strings.Repeat("x", 20)))
		require.Equal(t, http.StatusUnauthorized, res.StatusCode, "failure %d", i)
	}
	res := b.loginFrom(t, "127.0.0.2", testToken)
	require.Equal(t, http.StatusTooManyRequests, res.StatusCode, "the right token from the address that guessed")
	require.Empty(t, res.Cookies(), "no session")
	secs, err := strconv.Atoi(res.Header.Get("Retry-After"))
	require.NoError(t, err)
	require.Positive(t, secs)
	res = b.loginFrom(t, "127.0.0.3", testToken)
	require.Equal(t, http.StatusSeeOther, res.StatusCode, "the right token from another address")
	sessionOf(t, res)

	// Guesses at the first bytes of the admin token, one address each.
	for i := range 10 {
		res := b.loginFrom(t, fmt.Sprintf("127.0.1.%d", i+1), adminToken[:8]+fmt.Sprintf("-guess-%d", i))
		require.Equal(t, http.StatusUnauthorized, res.StatusCode, "guess %d", i)
	}
	res = b.loginFrom(t, "127.0.2.1", adminToken)
	require.Equal(t, http.StatusTooManyRequests, res.StatusCode, "the guessed-at token, from an address that never guessed")
	res = b.loginFrom(t, "127.0.2.1", testToken)
	require.Equal(t, http.StatusSeeOther, res.StatusCode, "another token from there")
}

// TestLoginRefusesCrossSitePosts: a login posted from another site's page
// (Sec-Fetch-Site cross-site or same-site, or an Origin that is not this
// server) is refused with 403 and starts no session; the browser's own
// form (same-origin, or none: typed into the address bar) and clients
// that send neither header log in. Logout is held to the same rule.
func TestLoginRefusesCrossSitePosts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, h := range [][]string{
		{"Sec-Fetch-Site", "cross-site"},
		{"Sec-Fetch-Site", "same-site"},
		{"Origin", "https://evil.example"},
		{"Origin", "null"},
	} {
		res := b.login(t, testToken, "/", h...)
		require.Equal(t, http.StatusForbidden, res.StatusCode, "%v", h)
		require.Empty(t, res.Cookies(), "%v: no session", h)
	}
	for _, h := range [][]string{
		{"Sec-Fetch-Site", "same-origin"},
		{"Sec-Fetch-Site", "none"},
		{"Origin", b.url},
		nil,
	} {
		res := b.login(t, testToken, "/", h...)
		require.Equal(t, http.StatusSeeOther, res.StatusCode, "%v", h)
		sessionOf(t, res)
	}
	req, err := http.NewRequest(http.MethodPost, b.url+"/logout", nil)
	require.NoError(t, err)
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	res, err := b.noRedirects().Do(req)
	require.NoError(t, err)
	_ = res.Body.Close()
	require.Equal(t, http.StatusForbidden, res.StatusCode)
}
