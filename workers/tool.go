package workers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/palrun/pal/internal/egress"
	"github.com/palrun/pal/internal/redact"
	"github.com/palrun/pal/internal/telemetry"
)

// Tool is a Go function callable from tool nodes. It receives the rendered
// input and returns JSON output. A tool may be called again after a crash
// (with the same idempotency key, see StepFromContext), so it must
// tolerate re-invocation. Return a *ToolError to say whether a failure may
// be retried; other errors are retryable when the node's policy allows.
type Tool func(ctx context.Context, input json.RawMessage) (json.RawMessage, error)

// ToolError is a tool failure that says whether retrying may help.
type ToolError struct {
	Err       error
	Retryable bool
}

func (e *ToolError) Error() string { return e.Err.Error() }
func (e *ToolError) Unwrap() error { return e.Err }

// StepInfo identifies the step a tool runs for.
type StepInfo struct {
	RunID          string
	StepID         string
	Attempt        int
	IdempotencyKey string
}

type stepInfoKey struct{}

// StepFromContext returns the step a tool is running for.
func StepFromContext(ctx context.Context) (StepInfo, bool) {
	si, ok := ctx.Value(stepInfoKey{}).(StepInfo)
	return si, ok
}

// echoTool is the built-in "echo" tool: it returns its input. It is handy
// in demos and benchmarks.
func echoTool(_ context.Context, in json.RawMessage) (json.RawMessage, error) { return in, nil }

// maxSleep bounds the built-in sleep tool.
const maxSleep = 10 * time.Minute

// sleepTool is the built-in "sleep" tool: {"ms": N} waits N milliseconds
// (at most ten minutes) and returns {"slept_ms": N}. It stands in for slow
// work in demos, e.g. a worker to kill in the middle of a step.
func sleepTool(ctx context.Context, input json.RawMessage) (json.RawMessage, error) {
	var in struct {
		Ms int64 `json:"ms"`
	}
	dec := json.NewDecoder(bytes.NewReader(input))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		return nil, &ToolError{Err: fmt.Errorf("sleep tool: input: %w (want {\"ms\": N})", err)}
	}
	d := time.Duration(in.Ms) * time.Millisecond
	if in.Ms < 0 || d > maxSleep {
		return nil, &ToolError{Err: fmt.Errorf("sleep tool: ms=%d: want 0 to %d", in.Ms, maxSleep.Milliseconds())}
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	case <-t.C:
	}
	return json.Marshal(map[string]int64{"slept_ms": in.Ms})
}

// httpToolInput is the input of the built-in http tool.
type httpToolInput struct {
	Method  string            `json:"method"`
	URL     string            `json:"url"`
	Headers map[string]string `json:"headers"`
	Body    json.RawMessage   `json:"body"`
}

// maxHTTPToolBody caps the response body the http tool keeps.
const maxHTTPToolBody = 256 << 10

// httpTool is the built-in "http" tool: it sends one HTTP request and
// returns {"status","headers","body"}; a JSON response body is kept as
// JSON. It sends the step's idempotency key as Idempotency-Key. client
// passes the worker's egress policy: a refused address fails the step,
// not retryable. Errors name the URL as rendered (secret references, not
// values) with its userinfo and query values masked.
func httpTool(client *http.Client) Tool {
	return func(ctx context.Context, input json.RawMessage) (json.RawMessage, error) {
		var in httpToolInput
		dec := json.NewDecoder(bytes.NewReader(input))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&in); err != nil {
			return nil, &ToolError{Err: fmt.Errorf("http tool: input: %w", err)}
		}
		if in.Method == "" {
			in.Method = http.MethodGet
		}
		shown := redact.URL(in.URL)
		if !strings.HasPrefix(in.URL, "http://") && !strings.HasPrefix(in.URL, "https://") {
			return nil, &ToolError{Err: fmt.Errorf("http tool: url %q: want http:// or https://", shown)}
		}
		sec := secretsFromContext(ctx)
		target, sendHeaders, err := sec.expandAll(in.URL, in.Headers)
		if err != nil {
			return nil, fmt.Errorf("http tool: %w", err)
		}
		var body io.Reader
		if len(in.Body) > 0 && string(in.Body) != "null" {
			body = bytes.NewReader(in.Body)
		}
		req, err := http.NewRequestWithContext(ctx, strings.ToUpper(in.Method), target, body)
		if err != nil {
			return nil, &ToolError{Err: fmt.Errorf("http tool: url %q: %w", shown, unwrapURLError(err))}
		}
		if err := sec.allowTo(req.URL); err != nil {
			return nil, fmt.Errorf("http tool: %s %s: %w", req.Method, shown, err)
		}
		if body != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		for k, v := range sendHeaders {
			req.Header.Set(k, v)
		}
		if si, ok := StepFromContext(ctx); ok {
			req.Header.Set("Idempotency-Key", si.IdempotencyKey)
		}
		telemetry.Inject(ctx, req.Header) // traceparent of the step's span, with tracing on
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			// *url.Error quotes the URL it was sent to, secrets included.
			err = fmt.Errorf("http tool: %s %s: %w", req.Method, shown, unwrapURLError(err))
			if de := (*egress.DeniedError)(nil); errors.As(err, &de) {
				return nil, &ToolError{Err: err}
			}
			return nil, err
		}
		defer resp.Body.Close()
		raw, err := io.ReadAll(io.LimitReader(resp.Body, maxHTTPToolBody))
		if err != nil {
			return nil, fmt.Errorf("http tool: reading response: %w", err)
		}
		out := map[string]any{"status": resp.StatusCode, "duration_ms": time.Since(start).Milliseconds()}
		headers := map[string]string{}
		for k := range resp.Header {
			headers[k] = resp.Header.Get(k)
		}
		out["headers"] = headers
		mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
		if (mt == "application/json" || strings.HasSuffix(mt, "+json")) && json.Valid(raw) {
			out["body"] = json.RawMessage(raw)
		} else {
			out["body"] = string(raw)
		}
		if resp.StatusCode >= 400 {
			retry := resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusRequestTimeout
			return nil, &ToolError{Err: fmt.Errorf("http tool: %s %s: HTTP %d", req.Method, shown, resp.StatusCode), Retryable: retry}
		}
		return json.Marshal(out)
	}
}

// secretRedirects returns a copy of c whose redirects pass the secret
// host check first (secrets.allowTo): a redirect to a host a secret the
// request carries is not bound to is not followed, since net/http would
// send it the request's headers and a Referer holding its URL. Then c's
// own redirect check (the egress policy's) applies.
func secretRedirects(c *http.Client) *http.Client {
	cp := *c
	next := c.CheckRedirect
	if next == nil {
		next = egress.CheckRedirect
	}
	cp.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if err := secretsFromContext(req.Context()).allowTo(req.URL); err != nil {
			return fmt.Errorf("redirect: %w", err)
		}
		return next(req, via)
	}
	return &cp
}

// unwrapURLError drops the *url.Error wrapper, whose message quotes the
// whole URL, and keeps what went wrong.
func unwrapURLError(err error) error {
	if ue := (*url.Error)(nil); errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// errPermanent marks configuration errors that no retry can fix.
var errPermanent = errors.New("permanent")

type permanentError struct{ err error }

func (e *permanentError) Error() string        { return e.err.Error() }
func (e *permanentError) Unwrap() error        { return e.err }
func (e *permanentError) Is(target error) bool { return target == errPermanent }

func permanent(format string, args ...any) error {
	return &permanentError{err: fmt.Errorf(format, args...)}
}
