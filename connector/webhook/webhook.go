// Package webhook is PAL's webhook connector: it delivers a JSON body to an
// http or https URL with the delivery's idempotency key and returns the
// receiver's answer as a receipt.
//
// Invariant: one call to Deliver sends at most one request. PAL's journal decides about
// retries, so the connector never retries and never lets net/http replay a
// request on its own, and it does not follow redirects (a 3xx is a permanent
// failure that names the redirect's host).
//
// Every request carries:
//
//	Content-Type:    application/json   (a delivery header may replace it)
//	Idempotency-Key: <delivery key>     (cannot be replaced)
//	Pal-Run-Id:      <run id>           (cannot be replaced)
//	Pal-Step-Id:     <step id>          (cannot be replaced)
//
// Outcomes: a 2xx answer is a Receipt. Anything else is a *connector.Error:
//
//   - 408, 429, 5xx: Retryable.
//   - other 4xx, 3xx, non-http(s) URL, invalid headers or body: permanent,
//     and the last three are refused before anything is sent.
//   - timeout: Retryable and Timeout, and Unknown once a connection was
//     made (the receiver may have acted on the request).
//   - connection cut after a connection was made: Retryable and Unknown.
//   - connection never made (refused, DNS, TLS handshake): Retryable only.
//   - ctx cancelled: the error wraps context.Canceled; Unknown as above and
//     not Retryable. The caller stops driving the run rather than failing
//     the step.
//
// Error messages name the method and the URL's host but never its path or
// query, which often hold a receiver's secret token.
//
// Every connection passes an egress policy (WithEgress): by default a
// webhook cannot reach loopback, link-local, private or other non-public
// addresses, checked on the resolved address as it connects. A refusal is
// a permanent *connector.Error wrapping an *egress.DeniedError, and nothing
// is sent.
package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/palrun/pal/connector"
	"github.com/palrun/pal/internal/egress"
	"github.com/palrun/pal/internal/telemetry"
)

// Kind is the connector kind used in workflows.
const Kind = "webhook"

// DefaultTimeout bounds one delivery, from dialling to reading the answer.
const DefaultTimeout = 30 * time.Second

// userAgent is sent unless a delivery header replaces it.
const userAgent = "pal-webhook"

// drainLimit is how much of an answer beyond the receipt is read so the
// connection can be reused.
const drainLimit = 64 << 10

// snippetLen is how much of an error answer is quoted in the error message.
const snippetLen = 256

// Webhook delivers JSON bodies over HTTP. It is safe for concurrent use.
type Webhook struct {
	client  *http.Client
	timeout time.Duration
	egress  *egress.Policy
}

// Option configures a Webhook.
type Option func(*Webhook)

// WithClient sends with a copy of c (its transport, TLS settings, and its
// Timeout if set). Redirects stay disabled whatever c.CheckRedirect says.
// An *http.Transport (or none) is cloned to pass the egress policy, with
// proxies off; another RoundTripper is used as it is and answers for its
// own egress. A nil c keeps the default client.
func WithClient(c *http.Client) Option {
	return func(w *Webhook) {
		if c != nil {
			cp := *c
			w.client = &cp
		}
	}
}

// WithTimeout bounds each delivery; a non-positive d keeps DefaultTimeout.
func WithTimeout(d time.Duration) Option {
	return func(w *Webhook) {
		if d > 0 {
			w.timeout = d
		}
	}
}

// WithEgress sets what the webhook may call. Nil (the default) refuses
// every non-public address; see the egress package.
func WithEgress(p *egress.Policy) Option {
	return func(w *Webhook) { w.egress = p }
}

// New returns a webhook connector.
func New(opts ...Option) *Webhook {
	w := &Webhook{client: &http.Client{}, timeout: DefaultTimeout}
	for _, opt := range opts {
		opt(w)
	}
	w.egress.Secure(w.client)
	w.client.CheckRedirect = func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}
	return w
}

// Kind returns "webhook".
func (w *Webhook) Kind() string { return Kind }

// Deliver sends d once and returns the receiver's 2xx answer as a receipt.
// Failures are *connector.Error values classified as the package comment
// describes.
func (w *Webhook) Deliver(ctx context.Context, d connector.Delivery) (*connector.Receipt, error) {
	u, err := checkDelivery(d)
	if err != nil {
		return nil, &connector.Error{Connector: Kind, Err: err}
	}
	method := strings.ToUpper(d.Method)
	if method == "" {
		method = http.MethodPost
	}
	where := fmt.Sprintf("%s to %s", method, u.Host)

	reqCtx, cancel := context.WithTimeout(ctx, w.timeout)
	defer cancel()
	// connected turns true once the transport holds a connection for this
	// request; from then on bytes may reach the receiver, so a failure has
	// an unknown outcome.
	var connected atomic.Bool
	reqCtx = httptrace.WithClientTrace(reqCtx, &httptrace.ClientTrace{
		GotConn: func(httptrace.GotConnInfo) { connected.Store(true) },
	})

	req, err := http.NewRequestWithContext(reqCtx, method, u.String(), body(d.Body))
	if err != nil {
		return nil, &connector.Error{Connector: Kind, Err: fmt.Errorf("%s: %w", where, unwrapURLError(err))}
	}
	// Without GetBody the request is not replayable: net/http would
	// otherwise resend a request that carries Idempotency-Key after a
	// connection cut on a reused connection, a second delivery nobody
	// journaled.
	req.GetBody = nil
	req.Header.Set("User-Agent", userAgent)
	req.Header.Set("Content-Type", "application/json")
	for name, value := range d.Headers {
		req.Header.Set(name, value)
	}
	req.Header.Set(connector.HeaderIdempotencyKey, d.IdempotencyKey)
	if d.RunID != "" {
		req.Header.Set(connector.HeaderRunID, d.RunID)
	}
	if d.StepID != "" {
		req.Header.Set(connector.HeaderStepID, d.StepID)
	}
	telemetry.Inject(ctx, req.Header) // traceparent of the step's span, with tracing on

	resp, err := w.client.Do(req)
	if err != nil {
		return nil, sendError(ctx, where, unwrapURLError(err), connected.Load())
	}
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, connector.MaxReceiptBody))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, drainLimit))
	_ = resp.Body.Close()

	if len(answer) == 0 {
		answer = nil
	}
	return classify(where, resp, answer)
}

// checkDelivery refuses a delivery that must not be sent, and returns its
// parsed URL.
func checkDelivery(d connector.Delivery) (*url.URL, error) {
	if d.IdempotencyKey == "" {
		return nil, errors.New("delivery has no idempotency key; PAL sends one with every external call")
	}
	if d.URL == "" {
		return nil, errors.New("webhook URL is empty; set the connector's url")
	}
	u, err := url.Parse(d.URL)
	if err != nil {
		// url.Parse quotes the whole URL; keep only the reason.
		return nil, fmt.Errorf("webhook URL does not parse: %w", unwrapURLError(err))
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("webhook URL scheme %q is not allowed; use an http or https URL", u.Scheme)
	}
	if u.Host == "" {
		return nil, errors.New("webhook URL has no host; use an absolute http or https URL")
	}
	if err := connector.ValidateHeaders(d.Headers); err != nil {
		return nil, err
	}
	if len(d.Body) > 0 && !json.Valid(d.Body) {
		return nil, errors.New("delivery body is not valid JSON")
	}
	return u, nil
}

// body returns the request body for b. An empty body is still a non-nil,
// non-NoBody reader so that net/http does not treat the request as
// replayable (see the GetBody comment in Deliver); net/http then sends an
// empty POST, PUT or PATCH body as a zero-length chunked body, and none for
// GET, HEAD or DELETE.
func body(b []byte) io.Reader {
	if len(b) == 0 {
		return emptyBody{}
	}
	return bytes.NewReader(b)
}

type emptyBody struct{}

func (emptyBody) Read([]byte) (int, error) { return 0, io.EOF }

// sendError classifies a failure to get an answer.
func sendError(ctx context.Context, where string, err error, connected bool) *connector.Error {
	if de := (*egress.DeniedError)(nil); errors.As(err, &de) {
		return &connector.Error{Connector: Kind, Err: fmt.Errorf("%s: %w", where, de)}
	}
	if ctxErr := ctx.Err(); errors.Is(ctxErr, context.Canceled) {
		cause := ctxErr
		if c := context.Cause(ctx); c != nil && !errors.Is(c, ctxErr) {
			cause = fmt.Errorf("%w (%v)", ctxErr, c)
		}
		return &connector.Error{
			Connector: Kind,
			Unknown:   connected,
			Err:       fmt.Errorf("%s: delivery abandoned: %w", where, cause),
		}
	}
	if isTimeout(err) {
		return &connector.Error{
			Connector: Kind,
			Retryable: true,
			Unknown:   connected,
			Timeout:   true,
			Err:       fmt.Errorf("%s: timed out: %w", where, err),
		}
	}
	if connected {
		return &connector.Error{
			Connector: Kind,
			Retryable: true,
			Unknown:   true,
			Err:       fmt.Errorf("%s: connection failed after sending, outcome unknown: %w", where, err),
		}
	}
	return &connector.Error{
		Connector: Kind,
		Retryable: true,
		Err:       fmt.Errorf("%s: could not connect: %w", where, err),
	}
}

func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// classify turns an answer into a receipt or an error.
func classify(where string, resp *http.Response, answer []byte) (*connector.Receipt, error) {
	code := resp.StatusCode
	switch {
	case code >= 200 && code < 300:
		return &connector.Receipt{Status: code, Body: answer}, nil
	case code >= 300 && code < 400:
		to := "no Location"
		if loc, err := resp.Location(); err == nil {
			to = loc.Host
		}
		return nil, &connector.Error{
			Connector: Kind,
			Status:    code,
			Err: fmt.Errorf("%s: redirected to %s, which PAL does not follow; set the connector's url to the final address",
				where, to),
		}
	case code == http.StatusRequestTimeout, code == http.StatusTooManyRequests, code >= 500 && code < 600:
		return nil, &connector.Error{Connector: Kind, Status: code, Retryable: true, Err: statusError(where, code, answer)}
	default:
		return nil, &connector.Error{Connector: Kind, Status: code, Err: statusError(where, code, answer)}
	}
}

func statusError(where string, code int, answer []byte) error {
	text := http.StatusText(code)
	if text == "" {
		text = "unexpected status"
	}
	if len(answer) == 0 {
		return fmt.Errorf("%s: %s", where, text)
	}
	return fmt.Errorf("%s: %s: %q", where, text, snippet(answer))
}

// snippet returns the start of an answer, cut at a rune boundary.
func snippet(b []byte) string {
	if len(b) <= snippetLen {
		return string(bytes.TrimSpace(b))
	}
	cut := snippetLen
	for cut > snippetLen-utf8.UTFMax && !utf8.RuneStart(b[cut]) {
		cut--
	}
	return string(bytes.TrimSpace(b[:cut])) + "…"
}

// unwrapURLError drops the *url.Error wrapper, whose message quotes the whole
// URL (path and query included).
func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}
