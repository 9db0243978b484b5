package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/grpc/codes"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/internal/limit"
	"github.com/palrun/pal/projections"
	"github.com/palrun/pal/readmodel"
	"github.com/palrun/pal/receipt"
	"github.com/palrun/pal/runs"
)

// MaxBodyBytes bounds a request body; a larger one is refused with 413.
const MaxBodyBytes = runs.MaxCommandBytes

// DefaultKeepAlive is how often an idle event stream gets a comment line.
const DefaultKeepAlive = 15 * time.Second

// RunLister lists runs from the read side (projections.Reader does).
type RunLister interface {
	// ListRuns returns runs newest first. Errors: projections.ErrBadCursor.
	ListRuns(ctx context.Context, f projections.RunFilter) ([]readmodel.RunRow, error)
}

// RunReader reads one run from the read side (projections.Reader does).
// A Runs that is one serves the runs whose journal retention removed.
type RunReader interface {
	// GetRun returns the run's rows. Errors: projections.ErrRunNotFound.
	GetRun(ctx context.Context, runID string) (readmodel.RunDetail, error)
}

// HandlerConfig configures NewHandler.
type HandlerConfig struct {
	// Store is the journal (required).
	Store *eventstore.Store
	// NC announces cancels to the driving worker; default: the store's
	// connection.
	NC *nats.Conn
	// Runs serves GET /v1/runs; nil answers it with 503 (the listing needs
	// the Postgres projection). A Runs that is also a RunReader
	// (projections.Reader) serves GET /v1/runs/{id} and gRPC GetRun of a
	// run whose journal retention removed, and its event feeds' 410.
	Runs RunLister
	// Ready is an extra readiness check for GET /readyz (e.g. Postgres);
	// NATS is always checked. Return a *NotReadyError to name what is
	// down.
	Ready func(ctx context.Context) error
	// Tokens are the accepted bearer tokens.
	Tokens []Token
	// Insecure serves /v1 without authentication when Tokens is empty.
	// Without it, a handler with no tokens refuses every /v1 request.
	Insecure bool
	// Logger receives request failures (default slog.Default()).
	Logger *slog.Logger
	// KeepAlive is the interval of comment lines on idle event streams
	// (DefaultKeepAlive).
	KeepAlive time.Duration
	// Keys are the signing keys whose public halves GET /v1/keys serves;
	// nil serves an empty list.
	Keys *receipt.Keys
	// MetricsOpen serves GET /metrics without a token (PAL_METRICS_OPEN);
	// otherwise it needs a token with scope read, like every /v1 route.
	MetricsOpen bool
	// SessionTTL is how long a web UI login lasts (DefaultSessionTTL).
	SessionTTL time.Duration
	// TrustForwardedProto marks session cookies Secure when a proxy in
	// front says X-Forwarded-Proto: https (set it only behind one).
	TrustForwardedProto bool
	// Client starts and controls runs; default runs.New on Store, held
	// to Limiter (pass one to set its options, e.g.
	// runs.WithAnomalyDefaults and runs.WithLimiter).
	Client *runs.Client
	// Limiter holds each token to its limits (internal/limit): the rate
	// of event streams it opens and how many it holds open, here, and,
	// through the default Client, its starts and commands. Default:
	// limit.New(limit.Defaults()). Pass the one a given Client holds, so
	// that REST and the NATS service share each caller's limits.
	Limiter *limit.Limiter
	// LoginFailures bounds failed web UI logins per client address and
	// per token prefix (DefaultLoginFailures when zero).
	LoginFailures limit.Rate
}

type handler struct {
	cfg    HandlerConfig
	client *runs.Client
	// mcp serves POST /mcp (mcp.go).
	mcp http.Handler
	// rows reads the runs whose journal retention removed (nil: none).
	rows  RunReader
	nc    *nats.Conn
	auth  *authenticator
	log   *slog.Logger
	feeds *feeds
	// limiter holds tokens to their limits (HandlerConfig.Limiter);
	// logins bounds failed logins (login_guard.go).
	limiter *limit.Limiter
	logins  *loginGuard

	receiptsMu sync.Mutex
	receipts   *receipt.Store // opened on first use
	// sessions are the web UI's logged-in browsers (browser.go).
	sessions *sessionStore
}

// NewHandler returns PAL's REST API: the routes Routes lists, and the
// web UI's pages (browser.go).
//
// On the same address, HTTP/2 requests with content type application/grpc
// go to the gRPC service pal.v1.RunService (StreamRunEvents, GetRun; see
// proto/pal/v1/run.proto), with the same tokens in the authorization
// metadata and scope read.
//
// Every /v1 request needs "Authorization: Bearer <token>" of a token with
// the route's scope, or a web UI session cookie standing for one (see
// browser.go; the UI's pages are served on the same address). The token's
// name is who starts, approves or cancels; a body naming another approver
// or canceller needs scope admin. Bodies are JSON, at most MaxBodyBytes;
// errors are {"error": code, "detail": message} with code one of
// bad_input (400), unauthorized (401), forbidden (403), not_found (404),
// method_not_allowed (405), conflict (409), journal_removed (410),
// too_large (413; 431 for headers over MaxHeaderBytes), rate_limited (429,
// with Retry-After), unavailable (503).
func NewHandler(cfg HandlerConfig) http.Handler {
	h := &handler{cfg: cfg, nc: cfg.NC, auth: newAuthenticator(cfg.Tokens), log: cfg.Logger}
	if h.log == nil {
		h.log = slog.Default()
	}
	if h.nc == nil && cfg.Store != nil {
		h.nc = cfg.Store.JetStream().Conn()
	}
	h.limiter = cfg.Limiter
	if h.limiter == nil {
		h.limiter = limit.New(limit.Defaults(), nil)
	}
	h.logins = newLoginGuard(cfg.LoginFailures, nil)
	h.client = cfg.Client
	h.rows, _ = cfg.Runs.(RunReader)
	if h.client == nil {
		h.client = runs.New(cfg.Store, runs.WithConn(h.nc), runs.WithLimiter(h.limiter))
	}
	if h.cfg.KeepAlive <= 0 {
		h.cfg.KeepAlive = DefaultKeepAlive
	}
	h.mcp = h.mcpHandler()
	h.feeds = newFeeds(cfg.Store, h.log)
	h.sessions = newSessionStore(cfg.SessionTTL)
	return withHeaderBound(withGRPC(newGRPCServer(h), h.mux()))
}

// MaxHeaderBytes bounds a request's headers (the request line and every
// header line); larger ones are refused with 431 and a JSON too_large
// error (gRPC: RESOURCE_EXHAUSTED). Server lets Go read up to
// http.DefaultMaxHeaderBytes, so that PAL, not Go's plain-text 431,
// answers between the two.
const MaxHeaderBytes = 64 << 10

// withHeaderBound refuses a request whose headers are over MaxHeaderBytes.
func withHeaderBound(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := len(r.Method) + len(r.RequestURI) + len(r.Host) + len(r.Proto)
		for k, vs := range r.Header {
			for _, v := range vs {
				n += len(k) + len(v) + 4 // ": " and CRLF
			}
		}
		if n <= MaxHeaderBytes {
			next.ServeHTTP(w, r)
			return
		}
		msg := fmt.Sprintf("request headers are larger than the limit of %d bytes", MaxHeaderBytes)
		if isGRPC(r) {
			// A trailers-only answer: the status in the headers, no body.
			w.Header().Set("Content-Type", "application/grpc")
			w.Header().Set("Grpc-Status", strconv.Itoa(int(codes.ResourceExhausted)))
			w.Header().Set("Grpc-Message", msg)
			w.WriteHeader(http.StatusOK)
			return
		}
		writeError(w, http.StatusRequestHeaderFieldsTooLarge, codeTooLarge, msg, "")
	})
}

// jsonFallbacks serves mux, answering requests that match no route with
// JSON errors instead of the mux's plain-text 404 and 405.
func jsonFallbacks(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, pattern := mux.Handler(r); pattern != "" {
			mux.ServeHTTP(w, r)
			return
		}
		rec := &headerRecorder{header: http.Header{}}
		mux.ServeHTTP(rec, r)
		switch rec.status {
		case http.StatusNotFound:
			writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("no such endpoint: %s %s", r.Method, r.URL.Path), "")
		case http.StatusMethodNotAllowed:
			w.Header().Set("Allow", rec.header.Get("Allow"))
			writeError(w, http.StatusMethodNotAllowed, "method_not_allowed",
				fmt.Sprintf("%s is not allowed on %s (allowed: %s)", r.Method, r.URL.Path, rec.header.Get("Allow")), "")
		default: // a redirect to the clean path
			for k, v := range rec.header {
				w.Header()[k] = v
			}
			w.WriteHeader(rec.status)
		}
	})
}

// headerRecorder keeps the status and headers a fallback handler writes.
type headerRecorder struct {
	header http.Header
	status int
}

func (r *headerRecorder) Header() http.Header { return r.header }
func (r *headerRecorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return len(p), nil
}
func (r *headerRecorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
}

// errorBody is every error answer.
type errorBody struct {
	Error  string `json:"error"`
	Detail string `json:"detail"`
	// Field names the request field at fault, when there is one.
	Field string `json:"field,omitempty"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		status = http.StatusInternalServerError
		buf.Reset()
		buf.WriteString(`{"error":"internal","detail":"encoding the answer failed"}` + "\n")
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

func writeError(w http.ResponseWriter, status int, code, detail, field string) {
	writeJSON(w, status, errorBody{Error: code, Detail: detail, Field: field})
}

// fail answers err, classified like the durable commands' answers
// (answerCode, answerCodes).
func (h *handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	code, field := answerCode(err)
	detail := err.Error()
	switch code {
	case codeTooLarge:
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			detail = fmt.Sprintf("request body is larger than the limit of %d bytes", mbe.Limit)
		}
	case runs.CodeBadInput:
		var ie *runs.InputError
		if errors.As(err, &ie) && ie.Field != "" && !strings.HasPrefix(detail, ie.Field+":") {
			detail = ie.Field + ": " + detail
		}
	case runs.CodeNotFound:
		if id := r.PathValue("id"); id != "" {
			detail = fmt.Sprintf("run %s not found", id)
		}
	case runs.CodeUnavailable:
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			detail = "timed out talking to NATS JetStream: " + detail
		}
		h.log.Warn("api request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	case runs.CodeInternal:
		h.log.Error("api request failed for good", "method", r.Method, "path", r.URL.Path, "err", err)
	case runs.CodeRateLimited:
		var le *limit.Error
		if errors.As(err, &le) {
			w.Header().Set("Retry-After", strconv.Itoa(le.RetryAfterSeconds()))
		}
	}
	_, tc := transportOf(code)
	writeError(w, tc.http, code, detail, field)
}

// readBody reads a request body of at most MaxBodyBytes. A body that is
// larger returns *http.MaxBytesError (413); empty reports whether it held
// only white space.
func readBody(w http.ResponseWriter, r *http.Request) (body []byte, empty bool, err error) {
	if r.ContentLength > MaxBodyBytes {
		return nil, false, &http.MaxBytesError{Limit: MaxBodyBytes}
	}
	body, err = io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, false, err
		}
		return nil, false, &runs.InputError{Msg: "reading the request body: " + err.Error()}
	}
	return body, len(bytes.TrimSpace(body)) == 0, nil
}

// pathRunID returns the run id of the path, refusing one that is not a
// single NATS subject token.
func pathRunID(r *http.Request) (string, error) {
	id := r.PathValue("id")
	if err := event.ValidateRunID(id); err != nil {
		return "", &runs.InputError{Field: "run_id", Msg: err.Error()}
	}
	return id, nil
}

func requestContext(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), 30*time.Second)
}

func (h *handler) getRun(w http.ResponseWriter, r *http.Request) {
	id, err := pathRunID(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	ctx, cancel := requestContext(r)
	defer cancel()
	v, err := runView(ctx, h.client, h.rows, h.log, id)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

func (h *handler) getThread(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := requestContext(r)
	defer cancel()
	v, err := h.client.Thread(ctx, r.PathValue("id"))
	if errors.Is(err, runs.ErrThreadNotFound) {
		writeError(w, http.StatusNotFound, runs.CodeNotFound, fmt.Sprintf("thread %s not found: no thread step of a run on it has started", r.PathValue("id")), "")
		return
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

func (h *handler) listRuns(w http.ResponseWriter, r *http.Request) {
	if h.cfg.Runs == nil {
		writeError(w, http.StatusServiceUnavailable, "unavailable", "listing runs needs DATABASE_URL", "")
		return
	}
	f, err := runs.ParseRunFilter(r.URL.Query())
	if err != nil {
		h.fail(w, r, err)
		return
	}
	ctx, cancel := requestContext(r)
	defer cancel()
	rows, err := h.cfg.Runs.ListRuns(ctx, f)
	if err != nil {
		// The cause may name the database and its user: log it, answer
		// without it.
		h.log.Warn("listing runs failed", "err", err)
		writeError(w, http.StatusServiceUnavailable, "unavailable", "listing runs: the Postgres projection is not available (the server log says why)", "")
		return
	}
	writeJSON(w, http.StatusOK, runs.ListOf(rows, f.Limit))
}

func (h *handler) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]bool{"ok": true})
}

// readyTimeout bounds the readiness checks.
const readyTimeout = 2 * time.Second

func (h *handler) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
	defer cancel()
	if err := h.natsReady(ctx); err != nil {
		writeError(w, http.StatusServiceUnavailable, "unavailable", "NATS: "+err.Error(), "")
		return
	}
	if h.cfg.Ready != nil {
		if err := h.cfg.Ready(ctx); err != nil {
			// /readyz needs no token: its answer names what is down, the
			// log says why.
			h.log.Debug("not ready", "err", err)
			what := "a dependency"
			var ne *NotReadyError
			if errors.As(err, &ne) {
				what = ne.What
			}
			writeError(w, http.StatusServiceUnavailable, "unavailable", what+" is not reachable", "")
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]bool{"ok": true})
}

// natsReady checks the connection and that JetStream answers.
func (h *handler) natsReady(ctx context.Context) error {
	if h.nc == nil || h.cfg.Store == nil {
		return errors.New("not configured")
	}
	if st := h.nc.Status(); st != nats.CONNECTED {
		return fmt.Errorf("not connected (%s)", strings.ToLower(st.String()))
	}
	if _, err := h.cfg.Store.JetStream().AccountInfo(ctx); err != nil {
		h.log.Debug("not ready: JetStream does not answer", "err", err)
		return errors.New("JetStream does not answer")
	}
	return nil
}

// NotReadyError is what a HandlerConfig.Ready check returns to name the
// dependency that is down: /readyz answers "<What> is not reachable"
// without the cause, which may name hosts or users.
type NotReadyError struct {
	What string
	Err  error
}

func (e *NotReadyError) Error() string { return e.What + ": " + e.Err.Error() }
func (e *NotReadyError) Unwrap() error { return e.Err }
