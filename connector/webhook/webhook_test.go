package webhook_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/palrun/pal/connector"
	"github.com/palrun/pal/connector/connectortest"
	"github.com/palrun/pal/connector/webhook"
	"github.com/palrun/pal/internal/egress"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

type testBundle struct {
	recv *connectortest.Receiver
	hook *webhook.Webhook
}

func setup(t *testing.T, opts ...webhook.Option) *testBundle {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	opts = append([]webhook.Option{webhook.WithClient(&http.Client{Transport: tr}), loopbackOK}, opts...)
	return &testBundle{recv: connectortest.NewReceiver(t), hook: webhook.New(opts...)}
}

// loopbackOK lets a webhook reach the tests' local receivers, which the
// default egress policy refuses.
var loopbackOK = webhook.WithEgress((*egress.Policy)(nil).With(egress.Loopback...))

// key is the idempotency key PAL derives for a step attempt.
func key(runID, stepID string, attempt int) string {
	sum := sha256.Sum256([]byte(runID + "|" + stepID + "|" + strconv.Itoa(attempt)))
	return hex.EncodeToString(sum[:])
}

func delivery(url string) connector.Delivery {
	return connector.Delivery{
		RunID:          "run_01JTEST",
		StepID:         "notify",
		IdempotencyKey: key("run_01JTEST", "notify", 1),
		URL:            url,
		Body:           json.RawMessage(`{"summary":"all good"}`),
	}
}

func requireConnectorError(t *testing.T, err error) *connector.Error {
	t.Helper()
	require.Error(t, err)
	var ce *connector.Error
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "webhook", ce.Connector)
	return ce
}

func TestKind(t *testing.T) {
	t.Parallel()
	require.Equal(t, "webhook", webhook.New().Kind())
	var _ connector.Connector = webhook.New()
}

func TestDeliverSendsHeadersAndBody(t *testing.T) {
	t.Parallel()
	b := setup(t)

	d := delivery(b.recv.URL() + "/hooks/notify")
	d.Headers = map[string]string{"Authorization": "Bearer t0ken", "X-Team": "ops"}
	receipt, err := b.hook.Deliver(t.Context(), d)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, receipt.Status)
	require.JSONEq(t, `{"received":true,"idempotency_key":"`+d.IdempotencyKey+`"}`, string(receipt.Body))

	reqs := b.recv.Requests()
	require.Len(t, reqs, 1)
	q := reqs[0]
	require.Equal(t, http.MethodPost, q.Method)
	require.Equal(t, "/hooks/notify", q.Path)
	require.Equal(t, d.IdempotencyKey, q.IdempotencyKey)
	require.Equal(t, "run_01JTEST", q.RunID)
	require.Equal(t, "notify", q.StepID)
	require.Equal(t, "application/json", q.Header.Get("Content-Type"))
	require.Equal(t, "Bearer t0ken", q.Header.Get("Authorization"))
	require.Equal(t, "ops", q.Header.Get("X-Team"))
	require.Equal(t, "pal-webhook", q.Header.Get("User-Agent"))
	require.JSONEq(t, `{"summary":"all good"}`, string(q.Body))
	require.Equal(t, 1, b.recv.Count(d.IdempotencyKey))
}

func TestDeliverMethodAndContentType(t *testing.T) {
	t.Parallel()
	b := setup(t)

	d := delivery(b.recv.URL())
	d.Method = "put"
	d.Headers = map[string]string{"content-type": "application/cloudevents+json"}
	_, err := b.hook.Deliver(t.Context(), d)
	require.NoError(t, err)

	q := b.recv.Requests()[0]
	require.Equal(t, http.MethodPut, q.Method)
	require.Equal(t, "application/cloudevents+json", q.Header.Get("Content-Type"), "a delivery header may set the content type")
}

func TestDeliverEmptyBody(t *testing.T) {
	t.Parallel()
	b := setup(t)

	for _, method := range []string{"", http.MethodGet, http.MethodDelete} {
		d := delivery(b.recv.URL())
		d.Method = method
		d.Body = nil
		receipt, err := b.hook.Deliver(t.Context(), d)
		require.NoError(t, err, method)
		require.Equal(t, http.StatusOK, receipt.Status)
	}
	reqs := b.recv.Requests()
	require.Len(t, reqs, 3)
	for _, q := range reqs {
		require.Empty(t, q.Body, q.Method)
	}
	require.Equal(t, []string{"POST", "GET", "DELETE"}, []string{reqs[0].Method, reqs[1].Method, reqs[2].Method})
}

func TestIdempotencyKeyCannotBeOverridden(t *testing.T) {
	t.Parallel()
	b := setup(t)

	for _, name := range []string{"Idempotency-Key", "idempotency-key", "IDEMPOTENCY-KEY", "Pal-Run-Id", "pal-step-id"} {
		d := delivery(b.recv.URL())
		d.Headers = map[string]string{name: "chosen-by-user"}
		_, err := b.hook.Deliver(t.Context(), d)
		ce := requireConnectorError(t, err)
		require.False(t, ce.Retryable, name)
		require.False(t, ce.Unknown, name)
		require.ErrorContains(t, err, "is set by PAL and cannot be overridden")
	}
	require.Empty(t, b.recv.Requests(), "refused before sending")
}

func TestStatusClassification(t *testing.T) {
	t.Parallel()

	// The server answers with the status named by the path, and a body.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		code, err := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_, _ = w.Write([]byte(`{"detail":"answer ` + strconv.Itoa(code) + `"}`))
	}))
	t.Cleanup(srv.Close)
	hook := webhook.New(loopbackOK)

	tests := []struct {
		status    int
		ok        bool
		retryable bool
	}{
		{status: 200, ok: true},
		{status: 201, ok: true},
		{status: 202, ok: true},
		{status: 204, ok: true},
		{status: 400},
		{status: 401},
		{status: 403},
		{status: 404},
		{status: 409},
		{status: 410},
		{status: 413},
		{status: 422},
		{status: 408, retryable: true},
		{status: 429, retryable: true},
		{status: 500, retryable: true},
		{status: 502, retryable: true},
		{status: 503, retryable: true},
		{status: 504, retryable: true},
		{status: 599, retryable: true},
	}
	for _, tt := range tests {
		t.Run(strconv.Itoa(tt.status), func(t *testing.T) {
			t.Parallel()
			d := delivery(srv.URL + "/" + strconv.Itoa(tt.status))
			receipt, err := hook.Deliver(t.Context(), d)
			if tt.ok {
				require.NoError(t, err)
				require.Equal(t, tt.status, receipt.Status)
				if tt.status != http.StatusNoContent {
					require.JSONEq(t, `{"detail":"answer `+strconv.Itoa(tt.status)+`"}`, string(receipt.Body))
				}
				return
			}
			require.Nil(t, receipt)
			ce := requireConnectorError(t, err)
			require.Equal(t, tt.status, ce.Status)
			require.Equal(t, tt.retryable, ce.Retryable)
			require.False(t, ce.Unknown, "the receiver answered")
			require.False(t, ce.Timeout)
			require.ErrorContains(t, err, "HTTP "+strconv.Itoa(tt.status))
			require.ErrorContains(t, err, "answer "+strconv.Itoa(tt.status), "the answer is quoted")
		})
	}
}

func TestRedirectNotFollowed(t *testing.T) {
	t.Parallel()
	b := setup(t)

	redirector := httptest.NewServer(http.RedirectHandler(b.recv.URL()+"/elsewhere", http.StatusTemporaryRedirect))
	t.Cleanup(redirector.Close)

	// Even a client configured to follow redirects does not follow them.
	following := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return nil }}
	for _, hook := range []*webhook.Webhook{webhook.New(loopbackOK), webhook.New(webhook.WithClient(following), loopbackOK)} {
		_, err := hook.Deliver(t.Context(), delivery(redirector.URL+"/hook"))
		ce := requireConnectorError(t, err)
		require.Equal(t, http.StatusTemporaryRedirect, ce.Status)
		require.False(t, ce.Retryable)
		require.False(t, ce.Unknown)
		require.ErrorContains(t, err, "redirected to "+strings.TrimPrefix(b.recv.URL(), "http://"))
		require.ErrorContains(t, err, "PAL does not follow")
	}
	require.Empty(t, b.recv.Requests(), "the redirect target was never called")
}

func TestReceiptBodyIsCapped(t *testing.T) {
	t.Parallel()

	big := strings.Repeat("x", 3*connector.MaxReceiptBody)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(big))
	}))
	t.Cleanup(srv.Close)

	receipt, err := webhook.New(loopbackOK).Deliver(t.Context(), delivery(srv.URL))
	require.NoError(t, err)
	require.Len(t, receipt.Body, connector.MaxReceiptBody)
	require.Equal(t, big[:connector.MaxReceiptBody], string(receipt.Body))
}

func TestErrorsDoNotQuoteThePathOrQuery(t *testing.T) {
	t.Parallel()
	b := setup(t)

	b.recv.FailNext(nil, http.StatusInternalServerError, 1)
	_, err := b.hook.Deliver(t.Context(), delivery(b.recv.URL()+"/hooks/s3cr3t-path?sig=s3cr3t-query"))
	requireConnectorError(t, err)
	require.NotContains(t, err.Error(), "s3cr3t")
	require.Contains(t, err.Error(), "POST to "+strings.TrimPrefix(b.recv.URL(), "http://"))

	_, err = b.hook.Deliver(t.Context(), delivery(refusedURL(t)+"/hooks/s3cr3t-path?sig=s3cr3t-query"))
	requireConnectorError(t, err)
	require.NotContains(t, err.Error(), "s3cr3t")
}

func TestTimeoutIsUnknown(t *testing.T) {
	t.Parallel()
	b := setup(t, webhook.WithTimeout(100*time.Millisecond))

	hold := b.recv.Hold(nil)
	defer hold.Release()

	d := delivery(b.recv.URL())
	_, err := b.hook.Deliver(t.Context(), d)
	ce := requireConnectorError(t, err)
	require.True(t, ce.Timeout)
	require.True(t, ce.Unknown, "the request was sent")
	require.True(t, ce.Retryable)
	require.Zero(t, ce.Status)
	require.ErrorIs(t, err, context.DeadlineExceeded)

	q, err := hold.Wait(t.Context())
	require.NoError(t, err)
	require.Equal(t, d.IdempotencyKey, q.IdempotencyKey, "it reached the receiver")
}

func TestCallerDeadlineIsATimeout(t *testing.T) {
	t.Parallel()
	b := setup(t)

	hold := b.recv.Hold(nil)
	defer hold.Release()

	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	_, err := b.hook.Deliver(ctx, delivery(b.recv.URL()))
	ce := requireConnectorError(t, err)
	require.True(t, ce.Timeout)
	require.True(t, ce.Unknown)
	require.True(t, ce.Retryable)
}

func TestClientTimeoutIsATimeout(t *testing.T) {
	t.Parallel()
	b := setup(t)

	hold := b.recv.Hold(nil)
	defer hold.Release()

	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	hook := webhook.New(webhook.WithClient(&http.Client{Transport: tr, Timeout: 100 * time.Millisecond}), loopbackOK)
	_, err := hook.Deliver(t.Context(), delivery(b.recv.URL()))
	ce := requireConnectorError(t, err)
	require.True(t, ce.Timeout)
	require.True(t, ce.Unknown)
	require.True(t, ce.Retryable)
}

func TestCancelledIsWrapped(t *testing.T) {
	t.Parallel()
	b := setup(t)

	hold := b.recv.Hold(nil)
	defer hold.Release()

	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		_, err := b.hook.Deliver(ctx, delivery(b.recv.URL()))
		errc <- err
	}()
	_, err := hold.Wait(t.Context())
	require.NoError(t, err)
	cancel()

	err = <-errc
	ce := requireConnectorError(t, err)
	require.ErrorIs(t, err, context.Canceled)
	require.True(t, ce.Unknown, "the request was sent before the cancel")
	require.False(t, ce.Retryable, "the caller stopped; it is not the receiver's failure")
	require.False(t, ce.Timeout)

	// Cancelled before anything was sent: not unknown.
	ctx, cancel = context.WithCancel(t.Context())
	cancel()
	_, err = b.hook.Deliver(ctx, delivery(b.recv.URL()))
	ce = requireConnectorError(t, err)
	require.ErrorIs(t, err, context.Canceled)
	require.False(t, ce.Unknown)
	require.Equal(t, 1, b.recv.Count(delivery("").IdempotencyKey))
}

func TestDropIsUnknown(t *testing.T) {
	t.Parallel()
	b := setup(t)

	b.recv.Drop(nil, 1)
	d := delivery(b.recv.URL())
	_, err := b.hook.Deliver(t.Context(), d)
	ce := requireConnectorError(t, err)
	require.True(t, ce.Unknown)
	require.True(t, ce.Retryable)
	require.False(t, ce.Timeout)
	require.Zero(t, ce.Status)
	require.Equal(t, 1, b.recv.Count(d.IdempotencyKey))
}

// TestDropOnReusedConnectionIsNotReplayed checks that net/http does not
// resend a request by itself: a request carrying Idempotency-Key on a reused
// connection counts as replayable to net/http unless PAL prevents it.
func TestDropOnReusedConnectionIsNotReplayed(t *testing.T) {
	t.Parallel()

	for _, body := range []json.RawMessage{json.RawMessage(`{"n":1}`), nil} {
		b := setup(t)

		warm := delivery(b.recv.URL())
		warm.IdempotencyKey = key("run_01JTEST", "warm", 1)
		_, err := b.hook.Deliver(t.Context(), warm)
		require.NoError(t, err, "opens a connection that stays idle in the pool")

		b.recv.Drop(nil, 1)
		d := delivery(b.recv.URL())
		d.Body = body
		_, err = b.hook.Deliver(t.Context(), d)
		ce := requireConnectorError(t, err)
		require.True(t, ce.Unknown)
		require.Equal(t, 1, b.recv.Count(d.IdempotencyKey), "sent once, not replayed (body %q)", body)
	}
}

// refusedURL returns the URL of a port nobody listens on.
func refusedURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return "http://" + addr
}

func TestRefusedIsRetryableNotUnknown(t *testing.T) {
	t.Parallel()

	_, err := webhook.New(loopbackOK).Deliver(t.Context(), delivery(refusedURL(t)))
	ce := requireConnectorError(t, err)
	require.True(t, ce.Retryable)
	require.False(t, ce.Unknown, "nothing was sent")
	require.False(t, ce.Timeout)
	require.Zero(t, ce.Status)
	require.ErrorContains(t, err, "could not connect")
}

func TestRefusedBeforeSending(t *testing.T) {
	t.Parallel()
	b := setup(t)
	host := strings.TrimPrefix(b.recv.URL(), "http://")

	tests := []struct {
		name    string
		change  func(*connector.Delivery)
		wantErr string
	}{
		{name: "ftp", change: func(d *connector.Delivery) { d.URL = "ftp://" + host + "/x" }, wantErr: `scheme "ftp" is not allowed`},
		{name: "file", change: func(d *connector.Delivery) { d.URL = "file:///etc/passwd" }, wantErr: `scheme "file" is not allowed`},
		{name: "mailto", change: func(d *connector.Delivery) { d.URL = "mailto:ops@example.test" }, wantErr: `scheme "mailto" is not allowed`},
		{name: "relative", change: func(d *connector.Delivery) { d.URL = "/hooks/x" }, wantErr: `scheme "" is not allowed`},
		{name: "no host", change: func(d *connector.Delivery) { d.URL = "http:///x" }, wantErr: "has no host"},
		{name: "empty", change: func(d *connector.Delivery) { d.URL = "" }, wantErr: "webhook URL is empty"},
		{name: "unparsable", change: func(d *connector.Delivery) { d.URL = "http://" + host + "/%zz" }, wantErr: "does not parse"},
		{name: "no key", change: func(d *connector.Delivery) { d.IdempotencyKey = "" }, wantErr: "no idempotency key"},
		{name: "bad JSON", change: func(d *connector.Delivery) { d.Body = json.RawMessage(`{"a":`) }, wantErr: "not valid JSON"},
		{name: "bad header", change: func(d *connector.Delivery) { d.Headers = map[string]string{"X-A": "1\r\nX-B: 2"} }, wantErr: "control characters"},
		{name: "bad method", change: func(d *connector.Delivery) { d.Method = "PO ST" }, wantErr: "invalid method"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			d := delivery(b.recv.URL())
			tt.change(&d)
			receipt, err := b.hook.Deliver(t.Context(), d)
			require.Nil(t, receipt)
			ce := requireConnectorError(t, err)
			require.False(t, ce.Retryable)
			require.False(t, ce.Unknown)
			require.Zero(t, ce.Status)
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
	t.Cleanup(func() {
		require.Empty(t, b.recv.Requests(), "nothing reached the receiver")
	})
}

func TestFlakyReceiverThenSuccessKeepsTheKey(t *testing.T) {
	t.Parallel()
	b := setup(t)

	d := delivery(b.recv.URL())
	b.recv.FailNext(nil, http.StatusServiceUnavailable, 1)
	b.recv.Drop(nil, 1)

	_, err := b.hook.Deliver(t.Context(), d)
	ce := requireConnectorError(t, err)
	require.Equal(t, http.StatusServiceUnavailable, ce.Status)
	require.True(t, ce.Retryable)

	_, err = b.hook.Deliver(t.Context(), d)
	ce = requireConnectorError(t, err)
	require.True(t, ce.Unknown)

	receipt, err := b.hook.Deliver(t.Context(), d)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, receipt.Status)
	require.Equal(t, 3, b.recv.Count(d.IdempotencyKey), "each Deliver sent exactly once with the same key")
}

func TestWithTimeoutIgnoresNonPositive(t *testing.T) {
	t.Parallel()
	b := setup(t, webhook.WithTimeout(0), webhook.WithTimeout(-time.Second), webhook.WithClient(nil))
	_, err := b.hook.Deliver(t.Context(), delivery(b.recv.URL()))
	require.NoError(t, err, "a zero timeout would have failed at once")
	require.False(t, errors.Is(err, context.DeadlineExceeded))
}

// With the default policy a webhook to a private, loopback or metadata
// address is refused before anything is sent, and may not be retried.
func TestEgressRefusedByDefault(t *testing.T) {
	t.Parallel()
	recv := connectortest.NewReceiver(t)
	for _, tc := range []struct {
		hook  *webhook.Webhook
		url   string
		class string
	}{
		{webhook.New(), recv.URL() + "/hook", egress.ClassLoopback},
		{webhook.New(), "http://10.0.0.7:9/hook", egress.ClassPrivate},
		{webhook.New(), "http://[::ffff:192.168.1.1]:9/hook", egress.ClassPrivate},
		{webhook.New(), "http://169.254.169.254/latest/meta-data/", egress.ClassMetadata},
		// WithClient keeps the policy: its transport is cloned to pass it.
		{webhook.New(webhook.WithClient(&http.Client{Transport: &http.Transport{}})), recv.URL(), egress.ClassLoopback},
	} {
		_, err := tc.hook.Deliver(t.Context(), delivery(tc.url))
		ce := requireConnectorError(t, err)
		var de *egress.DeniedError
		require.ErrorAs(t, err, &de, tc.url)
		require.Equal(t, tc.class, de.Class)
		require.False(t, ce.Retryable, tc.url)
		require.False(t, ce.Unknown, tc.url)
		require.ErrorContains(t, err, egress.EnvAllow)
	}
	require.Empty(t, recv.Requests(), "nothing reached the receiver")

	p, err := egress.Parse("10.0.0.0/8")
	require.NoError(t, err)
	_, err = webhook.New(webhook.WithEgress(p)).Deliver(t.Context(), delivery(recv.URL()))
	require.ErrorContains(t, err, "127.0.0.1 is a loopback address", "an exception for one range opens no other")
}
