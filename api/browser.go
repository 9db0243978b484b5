package api

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/palrun/pal/api/ui"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore/natsauth"
	"github.com/palrun/pal/internal/limit"
)

// The web UI (api/ui) is served on the REST API's address:
//
//	GET  /                 the runs list                      session
//	GET  /runs/{id}        a run's waterfall and journal      session
//	GET  /login            the login form                     none
//	POST /login            trade an API token for a session   none (body ≤ MaxLoginBytes; same origin; failures bounded)
//	POST /logout           end the session                    session + CSRF (same origin)
//	GET  /ui/...           the embedded CSS and scripts       none
//
// A browser logs in once with an API token and then holds a session
// cookie (HttpOnly, SameSite=Strict, Secure behind TLS, expiring after
// SessionTTL) that stands for that token's name and scopes on every /v1
// route, EventSource included. Sessions live in this process's memory: a
// restart logs every browser out, and behind several servers a browser
// must come back to the same one. Every request that changes something
// (any method but GET and HEAD) made with a session must carry the
// session's CSRF token in the X-CSRF-Token header (the pages have it in a
// meta tag), or it is refused with 403. Requests with a bearer token work
// as before and ignore the cookie. A login or logout posted from another
// site is refused with 403 (http.CrossOriginProtection), and failed
// logins are bounded per client address and per token prefix
// (loginGuard: 429 with Retry-After once spent, right token or not).

const (
	// SessionCookie is the name of the browser session cookie.
	SessionCookie = "pal_session"
	// CSRFHeader carries a session's CSRF token on changing requests.
	CSRFHeader = "X-CSRF-Token"
	// DefaultSessionTTL is how long a browser session lasts.
	DefaultSessionTTL = 12 * time.Hour
	// MaxLoginBytes bounds the body of POST /login.
	MaxLoginBytes = 4 << 10
	// maxSessions bounds the sessions held at once.
	maxSessions = 10000
	// maxSessionsPerToken bounds one token's: a token's next login ends
	// its oldest session, so no token holder can fill the store and lock
	// the others out.
	maxSessionsPerToken = 100
)

// session is one logged-in browser.
type session struct {
	who     principal
	token   [sha256.Size]byte // the SHA-256 of the token it was opened with
	csrf    string
	created time.Time
	expires time.Time
}

// sessionStore holds sessions by the SHA-256 of their cookie value, so a
// lookup's timing says nothing about a valid cookie.
type sessionStore struct {
	ttl time.Duration
	now func() time.Time

	mu sync.Mutex
	m  map[[sha256.Size]byte]*session
}

func newSessionStore(ttl time.Duration) *sessionStore {
	if ttl <= 0 {
		ttl = DefaultSessionTTL
	}
	return &sessionStore{ttl: ttl, now: time.Now, m: map[[sha256.Size]byte]*session{}}
}

var errTooManySessions = errors.New("too many browser sessions are open; try again later")

// create starts a session for who, logged in with token, and returns its
// cookie value. A token with maxSessionsPerToken sessions loses its
// oldest.
func (s *sessionStore) create(who principal, token string) (id string, sess *session, err error) {
	id, err = randomString(32)
	if err != nil {
		return "", nil, err
	}
	csrf, err := randomString(32)
	if err != nil {
		return "", nil, err
	}
	now := s.now()
	tk := sha256.Sum256([]byte(token))
	s.mu.Lock()
	defer s.mu.Unlock()
	var (
		mine   int
		oldest [sha256.Size]byte
		first  time.Time
	)
	for k, v := range s.m {
		if v.token != tk || !now.Before(v.expires) {
			continue
		}
		if mine++; first.IsZero() || v.created.Before(first) {
			oldest, first = k, v.created
		}
	}
	if mine >= maxSessionsPerToken {
		delete(s.m, oldest)
	}
	if len(s.m) >= maxSessions {
		for k, v := range s.m {
			if !now.Before(v.expires) {
				delete(s.m, k)
			}
		}
		if len(s.m) >= maxSessions {
			return "", nil, errTooManySessions
		}
	}
	sess = &session{who: who, token: tk, csrf: csrf, created: now, expires: now.Add(s.ttl)}
	s.m[sha256.Sum256([]byte(id))] = sess
	return id, sess, nil
}

// get returns the live session of the request's cookie.
func (s *sessionStore) get(r *http.Request) (*session, bool) {
	c, err := r.Cookie(SessionCookie)
	if err != nil || c.Value == "" || len(c.Value) > 128 {
		return nil, false
	}
	k := sha256.Sum256([]byte(c.Value))
	s.mu.Lock()
	defer s.mu.Unlock()
	sess, ok := s.m[k]
	if !ok {
		return nil, false
	}
	if !s.now().Before(sess.expires) {
		delete(s.m, k)
		return nil, false
	}
	return sess, true
}

// end drops the request's session.
func (s *sessionStore) end(r *http.Request) {
	if c, err := r.Cookie(SessionCookie); err == nil {
		s.mu.Lock()
		delete(s.m, sha256.Sum256([]byte(c.Value)))
		s.mu.Unlock()
	}
}

func randomString(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generating a session: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// changes reports whether a request method may change something.
func changes(method string) bool { return method != http.MethodGet && method != http.MethodHead }

// csrfOK checks a changing request's CSRF header against its session.
func csrfOK(r *http.Request, sess *session) bool {
	got := r.Header.Get(CSRFHeader)
	return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(sess.csrf)) == 1
}

// fromSession authenticates a request without a bearer token by its
// session cookie; ok false means there is none. A changing request
// without the session's CSRF token is answered 403 here (handled true).
func (h *handler) fromSession(w http.ResponseWriter, r *http.Request) (ctx context.Context, handled, ok bool) {
	sess, ok := h.sessions.get(r)
	if !ok {
		return nil, false, false
	}
	if changes(r.Method) && !csrfOK(r, sess) {
		writeError(w, http.StatusForbidden, codeForbidden, "a request made with a browser session needs the session's CSRF token in the "+CSRFHeader+" header", "")
		return nil, true, true
	}
	return withPrincipal(r.Context(), sess.who), false, true
}

// secure reports whether the request came over TLS, directly or (when
// configured) through a proxy that says so.
func (h *handler) secure(r *http.Request) bool {
	return r.TLS != nil || (h.cfg.TrustForwardedProto && strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https"))
}

// browserRoutes adds the web UI's routes to root.
func (h *handler) browserRoutes(root *http.ServeMux) {
	root.HandleFunc("GET /{$}", h.page("index.html", false))
	root.HandleFunc("GET /runs/{id}", h.page("run.html", true))
	root.HandleFunc("GET /workflows", h.page("workflows.html", false))
	root.HandleFunc("GET /schedules", h.page("schedules.html", false))
	root.HandleFunc("GET /login", h.loginForm)
	// A login or logout posted from another site is refused (login CSRF:
	// a page elsewhere logging the browser in as its own token):
	// Sec-Fetch-Site must be same-origin or none, or, without it, Origin
	// must name this server's host; a request with neither (curl, an old
	// browser) is no cross-site form post and passes.
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.renderPage(w, http.StatusForbidden, "login.html", pageData{Next: "/",
			Error: "this form was posted from another site; log in on this server's own login page"})
	}))
	root.Handle("POST /login", cop.Handler(http.HandlerFunc(h.login)))
	root.Handle("POST /logout", cop.Handler(http.HandlerFunc(h.logout)))
	static := http.StripPrefix("/ui/", http.FileServerFS(ui.Static()))
	root.Handle("GET /ui/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		securityHeaders(w)
		w.Header().Set("Cache-Control", "no-cache")
		static.ServeHTTP(w, r)
	}))
}

// securityHeaders keeps every page to its own origin's scripts and
// styles (no inline script runs, so text that slips into markup cannot
// act) and out of frames.
func securityHeaders(w http.ResponseWriter) {
	hdr := w.Header()
	hdr.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "+
		"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("X-Frame-Options", "DENY")
	hdr.Set("Referrer-Policy", "same-origin")
}

// pageData is what the page templates fill in.
type pageData struct {
	User    string
	Scopes  string
	CSRF    string
	RunID   string
	Error   string
	Next    string
	NoLogin bool
	// scopes are the session's: May leaves out of a page what it may
	// not do.
	scopes Scopes
}

// May reports whether the page's session has the scope written word
// (admin has every scope): the templates render an action only for a
// session that may take it, and the route checks it again.
func (d pageData) May(word string) bool {
	s, ok := natsauth.ScopeOf(word)
	return ok && d.scopes.Has(s)
}

// page serves a page template to a logged-in browser; others are sent to
// /login and back.
func (h *handler) page(name string, withRun bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		d := pageData{}
		if withRun {
			d.RunID = r.PathValue("id")
			if err := event.ValidateRunID(d.RunID); err != nil {
				h.renderPage(w, http.StatusBadRequest, "error.html", pageData{Error: "bad run id: " + err.Error()})
				return
			}
		}
		switch sess, ok := h.sessions.get(r); {
		case ok:
			d.User, d.Scopes, d.CSRF, d.scopes = sess.who.name, sess.who.scopes.String(), sess.csrf, sess.who.scopes
		case len(h.auth.digests) == 0 && h.cfg.Insecure:
			d.User, d.Scopes, d.NoLogin, d.scopes = insecurePrincipal.name, insecurePrincipal.scopes.String(), true, insecurePrincipal.scopes
		default:
			http.Redirect(w, r, "/login?next="+url.QueryEscape(r.URL.Path), http.StatusSeeOther)
			return
		}
		w.Header().Set("Cache-Control", "no-store")
		h.renderPage(w, http.StatusOK, name, d)
	}
}

func (h *handler) renderPage(w http.ResponseWriter, status int, name string, d pageData) {
	securityHeaders(w)
	t, err := ui.Pages()
	var buf bytes.Buffer
	if err == nil {
		err = t.ExecuteTemplate(&buf, name, d)
	}
	if err != nil {
		h.log.Error("rendering a web UI page failed", "page", name, "err", err)
		http.Error(w, "the page could not be rendered (the server log says why)", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// localPath returns next when it is a path on this server, else "/": a
// login cannot send the browser elsewhere.
func localPath(next string) string {
	if next == "" || len(next) > 512 || next[0] != '/' || strings.HasPrefix(next, "//") || strings.ContainsAny(next, "\\\r\n") {
		return "/"
	}
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" {
		return "/"
	}
	return next
}

func (h *handler) loginForm(w http.ResponseWriter, r *http.Request) {
	if len(h.auth.digests) == 0 && h.cfg.Insecure {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	h.renderPage(w, http.StatusOK, "login.html", pageData{Next: localPath(r.URL.Query().Get("next"))})
}

func (h *handler) login(w http.ResponseWriter, r *http.Request) {
	if r.ContentLength > MaxLoginBytes {
		h.renderPage(w, http.StatusRequestEntityTooLarge, "login.html", pageData{Error: fmt.Sprintf("the login form is larger than %d bytes", MaxLoginBytes), Next: "/"})
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, MaxLoginBytes)
	if err := r.ParseForm(); err != nil {
		status := http.StatusBadRequest
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			status = http.StatusRequestEntityTooLarge
		}
		h.renderPage(w, status, "login.html", pageData{Error: "the login form could not be read", Next: "/"})
		return
	}
	next := localPath(r.PostForm.Get("next"))
	tok := strings.TrimSpace(r.PostForm.Get("token"))
	key := loginKeyOf(r, tok)
	if wait := h.logins.wait(key); wait > 0 {
		secs := (&limit.Error{RetryAfter: wait}).RetryAfterSeconds()
		w.Header().Set("Retry-After", strconv.Itoa(secs))
		h.renderPage(w, http.StatusTooManyRequests, "login.html", pageData{Next: next,
			Error: fmt.Sprintf("too many failed logins from this address or for this token; try again in %d s", secs)})
		return
	}
	who, ok := h.auth.check(tok)
	if tok == "" || !ok {
		h.logins.failed(key)
		h.renderPage(w, http.StatusUnauthorized, "login.html", pageData{Error: "that is not one of this server's API tokens (PAL_API_TOKENS)", Next: next})
		return
	}
	id, sess, err := h.sessions.create(who, tok)
	if err != nil {
		h.renderPage(w, http.StatusServiceUnavailable, "login.html", pageData{Error: err.Error(), Next: next})
		return
	}
	http.SetCookie(w, &http.Cookie{Name: SessionCookie, Value: id, Path: "/", Expires: sess.expires,
		MaxAge: int(h.sessions.ttl / time.Second), HttpOnly: true, Secure: h.secure(r), SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (h *handler) logout(w http.ResponseWriter, r *http.Request) {
	sess, ok := h.sessions.get(r)
	if ok && r.Header.Get(CSRFHeader) == "" {
		// The page's logout form sends the token as a field.
		r.Body = http.MaxBytesReader(w, r.Body, MaxLoginBytes)
		if r.ParseForm() == nil {
			r.Header.Set(CSRFHeader, r.PostForm.Get("csrf"))
		}
	}
	if ok && !csrfOK(r, sess) {
		writeError(w, http.StatusForbidden, codeForbidden, "logging out needs the session's CSRF token", "")
		return
	}
	h.sessions.end(r)
	http.SetCookie(w, &http.Cookie{Name: SessionCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true,
		Secure: h.secure(r), SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

// getWaterfall serves GET /v1/runs/{id}/waterfall: the run's timeline for
// the web UI (runs.Waterfall), computed from the fold of its journal.
func (h *handler) getWaterfall(w http.ResponseWriter, r *http.Request) {
	id, err := pathRunID(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	ctx, cancel := requestContext(r)
	defer cancel()
	v, err := h.client.Waterfall(ctx, id)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}
