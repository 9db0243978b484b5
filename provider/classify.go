package provider

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"sync/atomic"
	"time"
)

// ErrMaybeDelivered is returned (wrapped) when the connection was lost after
// a request was written in full. The HTTP transport would resend such a
// request on a new connection by itself; Attempt stops it, so that a request
// reaches the provider at most once per call and PAL's own retry (journaled,
// same idempotency key) decides what happens next.
var ErrMaybeDelivered = errors.New("connection lost after the request was sent; not resending it")

// MaxResponseBytes bounds what PAL reads of one provider answer: the SDKs
// read a whole body into memory, and a provider (or whatever answers at its
// base URL) is outside PAL. The biggest real answers (128k output tokens
// with logprobs) are a few MiB.
const MaxResponseBytes = 32 << 20

// ErrResponseTooLarge is returned (wrapped) when an answer passes
// MaxResponseBytes; PAL stops reading it. The error is permanent: the
// provider did the work, and the same request would get the same answer.
var ErrResponseTooLarge = fmt.Errorf("provider answer over %d MiB; not read further", MaxResponseBytes>>20)

// Attempt follows one HTTP call to a provider so that a failure can be
// classified by how far the call got. Install Middleware in the SDK call
// (both official SDKs take a func(*http.Request, next) middleware), then
// turn the SDK's error into an *Error with Error. An Attempt is for one call;
// the zero value is ready to use.
type Attempt struct {
	handed    atomic.Bool // the SDK handed the request to the HTTP client
	connected atomic.Bool // a connection was obtained: bytes may reach the provider
	written   atomic.Bool // the whole request was written
	tooLarge  atomic.Bool // the answer passed MaxResponseBytes
}

// cappedBody reads at most MaxResponseBytes of an answer, then fails with
// ErrResponseTooLarge.
type cappedBody struct {
	io.ReadCloser
	left  int64 // bytes that may still be read, plus one to see the excess
	limit func()
}

func (b *cappedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, ErrResponseTooLarge
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	if b.left <= 0 {
		b.limit()
		return n - 1, ErrResponseTooLarge
	}
	return n, err
}

// Middleware records the call's progress and stops the HTTP transport from
// resending a request that was written in full (net/http does that on a
// reused connection for requests carrying an Idempotency-Key header).
// Requests on which nothing was written may still be resent. The answer's
// body is read at most up to MaxResponseBytes.
func (a *Attempt) Middleware(req *http.Request, next func(*http.Request) (*http.Response, error)) (*http.Response, error) {
	a.handed.Store(true)
	trace := &httptrace.ClientTrace{
		GotConn: func(httptrace.GotConnInfo) { a.connected.Store(true) },
		WroteRequest: func(info httptrace.WroteRequestInfo) {
			if info.Err == nil {
				a.written.Store(true)
			}
		},
	}
	r := req.WithContext(httptrace.WithClientTrace(req.Context(), trace))
	if getBody := r.GetBody; getBody != nil {
		r.GetBody = func() (io.ReadCloser, error) {
			if a.written.Load() {
				return nil, ErrMaybeDelivered
			}
			return getBody()
		}
	}
	resp, err := next(r)
	if resp != nil && resp.Body != nil {
		resp.Body = &cappedBody{ReadCloser: resp.Body, left: MaxResponseBytes + 1, limit: func() { a.tooLarge.Store(true) }}
	}
	return resp, err
}

// Error classifies err, the failure of the call this Attempt followed, as an
// *Error of the named provider; see Classify. It returns nil for a nil err.
// Unlike Classify it knows whether the request left the process: an error
// raised before the request was handed to the HTTP client (building or
// validating it) is permanent, and a failure before a connection was obtained
// is not Unknown.
func (a *Attempt) Error(name string, status int, err error) error {
	if err == nil {
		return nil
	}
	if a.tooLarge.Load() {
		return &Error{Provider: name, Status: status, Err: fmt.Errorf("%w: %v", ErrResponseTooLarge, err)}
	}
	reach := reachConnection
	switch {
	case !a.handed.Load():
		reach = reachNone
	case !a.connected.Load():
		reach = reachTransport
	}
	return classify(name, status, reach, err)
}

// ResponseError is Error for an SDK error that carries the provider's HTTP
// answer (nil when none arrived): its status classifies the failure, and a
// rate limit's headers say how long to wait (RetryAfter).
func (a *Attempt) ResponseError(name string, resp *http.Response, err error) error {
	status := 0
	if resp != nil {
		status = resp.StatusCode
	}
	perr := a.Error(name, status, err)
	if e, ok := perr.(*Error); ok && resp != nil && e.Retryable {
		e.RetryAfter, _ = RetryAfter(resp.Header, time.Now())
	}
	return perr
}

// Classify turns err, the failure of one call to the provider called name,
// into an *Error (nil for a nil err). status is the HTTP status of the provider's answer, 0 when
// no answer arrived. The rules:
//
//   - context.Canceled: not retryable; the *Error wraps context.Canceled.
//   - HTTP 408, 409, 429 and 5xx: Retryable; 429, 503 and 529 are also
//     RateLimited. 409 (another request with the
//     same idempotency key is in progress), 502 and 504 (a gateway lost the
//     answer) are also Unknown: the provider may have done the work.
//   - any other HTTP status: permanent.
//   - a deadline (context or HTTP client timeout): Timeout, Retryable, Unknown.
//   - a failure to connect (dial error, DNS): Retryable, not Unknown.
//   - a certificate that does not verify: permanent.
//   - anything else (EOF, connection reset, an answer that cannot be read):
//     Retryable and Unknown.
//
// Classify assumes the request may have been sent; Attempt.Error knows better.
func Classify(name string, status int, err error) error {
	if err == nil {
		return nil
	}
	return classify(name, status, reachConnection, err)
}

type reach int

const (
	reachNone       reach = iota // never handed to the HTTP client
	reachTransport               // handed over, no connection obtained
	reachConnection              // a connection was obtained
)

func classify(name string, status int, r reach, err error) *Error {
	var already *Error
	if errors.As(err, &already) {
		return already
	}
	e := &Error{Provider: name, Status: status, Err: err}
	if status >= 400 {
		switch {
		case status == http.StatusConflict,
			status == http.StatusBadGateway,
			status == http.StatusGatewayTimeout:
			e.Retryable, e.Unknown = true, true
		case status == http.StatusRequestTimeout,
			status == http.StatusTooManyRequests,
			status >= 500:
			e.Retryable = true
		}
		e.RateLimited = rateLimited(status)
		return e
	}
	sent := r == reachConnection
	if errors.Is(err, context.Canceled) {
		e.Unknown = sent
		return e
	}
	if isTimeout(err) {
		e.Timeout, e.Retryable, e.Unknown = true, true, sent
		return e
	}
	switch r {
	case reachNone:
		return e // a local error: the request never left
	case reachTransport:
		e.Retryable = true
		return e
	}
	if errors.Is(err, ErrMaybeDelivered) {
		e.Retryable, e.Unknown = true, true
		return e
	}
	var dnsErr *net.DNSError
	var opErr *net.OpError
	if errors.As(err, &dnsErr) || (errors.As(err, &opErr) && opErr.Op == "dial") {
		e.Retryable = true
		return e
	}
	var certErr *tls.CertificateVerificationError
	if errors.As(err, &certErr) {
		return e
	}
	e.Retryable, e.Unknown = true, true
	return e
}

func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
