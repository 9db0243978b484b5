package api

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"

	"github.com/palrun/pal/eventstore/natsauth"
	"github.com/palrun/pal/runs"
)

// DefaultTokenName is the identity of a token configured without a name.
const DefaultTokenName = "api"

// Scopes is what a token may do: natsauth.Scopes, the scopes of NATS
// client users too, so a REST token and a NATS user that may do the
// same are written the same.
type Scopes = natsauth.Scopes

// The scopes of PAL_API_TOKENS. Each /v1 route needs one (Routes lists
// which); ScopeAdmin implies all of them and also lets a request name
// another approver or canceller than the token's own name.
const (
	ScopeRead    = natsauth.ScopeRead    // reading: every GET /v1 route
	ScopeStart   = natsauth.ScopeStart   // making runs: start, resume, fork, retry
	ScopeApprove = natsauth.ScopeApprove // a run's inputs: approve, budget, signals
	ScopeCancel  = natsauth.ScopeCancel  // cancel
	ScopeDeploy  = natsauth.ScopeDeploy  // deploying workflows, and a start or fork that brings a definition
	ScopeAdmin   = natsauth.ScopeAdmin   // all of the above, and speaking for others

	// DefaultScopes is what a token written without scopes gets: every
	// route, as before scopes existed, but it acts only as itself.
	DefaultScopes = natsauth.DefaultScopes
)

// Token is one API bearer token and the identity it stands for: the name
// is the starter of run_created, the canceller of run_cancelled and the
// approver of approval_received. Scopes zero means DefaultScopes.
type Token struct {
	Name   string
	Secret string
	Scopes Scopes
}

// Entry writes t as one PAL_API_TOKENS entry, name=secret:scopes, which
// ParseTokens reads back as t. The scopes are always written, so a secret
// holding ':' comes back whole.
func (t Token) Entry() string {
	ss := t.Scopes
	if ss == 0 {
		ss = DefaultScopes
	}
	return t.Name + "=" + t.Secret + ":" + ss.String()
}

// FormatTokens writes tokens as PAL_API_TOKENS (see Token.Entry).
func FormatTokens(tokens []Token) string {
	entries := make([]string, len(tokens))
	for i, t := range tokens {
		entries[i] = t.Entry()
	}
	return strings.Join(entries, ",")
}

// ParseTokens parses PAL_API_TOKENS: comma-separated entries, each
// [name=]token[:scope+scope…]. Without a name the token is named "api";
// without scopes it gets DefaultScopes. A token that itself contains '='
// must be given with a name, and one that contains ':' with its scopes:
// the scopes are what follows the last ':'. Blank entries are ignored.
// Errors name the entry at fault by position and name, never quoting the
// token or anything after it but a known scope.
func ParseTokens(s string) ([]Token, error) {
	var out []Token
	seen := map[string]bool{}
	for i, raw := range strings.Split(s, ",") {
		entry := strings.TrimSpace(raw)
		if entry == "" {
			continue
		}
		t := Token{Name: DefaultTokenName, Secret: entry}
		if name, secret, ok := strings.Cut(entry, "="); ok {
			t = Token{Name: strings.TrimSpace(name), Secret: strings.TrimSpace(secret)}
		}
		if !validTokenName(t.Name) {
			return nil, fmt.Errorf("token %d: name %q: use letters, digits, '_', '-' and '.' (write name=token)", i+1, t.Name)
		}
		t.Scopes = DefaultScopes
		if at := strings.LastIndexByte(t.Secret, ':'); at >= 0 {
			ss, err := parseScopes(t.Secret[at+1:])
			if err != nil {
				return nil, fmt.Errorf("token %d (%s): %w", i+1, t.Name, err)
			}
			t.Secret, t.Scopes = strings.TrimSpace(t.Secret[:at]), ss
		}
		if t.Secret == "" {
			return nil, fmt.Errorf("token %d (%s): empty token", i+1, t.Name)
		}
		if strings.ContainsAny(t.Secret, " \t\r\n") {
			return nil, fmt.Errorf("token %d (%s): a token cannot contain white space", i+1, t.Name)
		}
		if seen[t.Secret] {
			return nil, fmt.Errorf("token %d (%s): the same token is listed twice", i+1, t.Name)
		}
		seen[t.Secret] = true
		out = append(out, t)
	}
	return out, nil
}

// parseScopes reads "read+start". An unknown word is named by position
// only: it may be the tail of a token that contains ':'.
func parseScopes(list string) (Scopes, error) {
	const want = natsauth.ScopeWords
	if strings.TrimSpace(list) == "" {
		return 0, fmt.Errorf("no scopes after ':' (want %s; leave out the ':' for the default scopes)", want)
	}
	ss, bad, n, twice := natsauth.ScopeList(list)
	switch {
	case bad > 0:
		return 0, fmt.Errorf("scope %d of %d after the last ':' is not one of %s "+
			"(a token that contains ':' must be followed by ':' and its scopes)", bad, n, want)
	case twice != "":
		return 0, fmt.Errorf("scope %s is listed twice", twice)
	}
	return ss, nil
}

func validTokenName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '-', r == '.':
		default:
			return false
		}
	}
	return true
}

// GenerateToken returns a fresh random token: "pal_" and 32 random bytes
// in unpadded base64url (no '=' or ',', so it can be listed in
// PAL_API_TOKENS as it is).
func GenerateToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generating an API token: %w", err)
	}
	return "pal_" + base64.RawURLEncoding.EncodeToString(b), nil
}

// authenticator checks bearer tokens. Each configured token is kept as
// its SHA-256 digest, and a presented token is hashed and compared with
// every one of them in constant time, without stopping at a match: how
// long a check takes says nothing about which token, or how much of one,
// was right.
type authenticator struct {
	who     []principal
	digests [][sha256.Size]byte
}

func newAuthenticator(tokens []Token) *authenticator {
	a := &authenticator{}
	for _, t := range tokens {
		if t.Scopes == 0 {
			t.Scopes = DefaultScopes
		}
		a.who = append(a.who, principal{name: t.Name, scopes: t.Scopes})
		a.digests = append(a.digests, sha256.Sum256([]byte(t.Secret)))
	}
	return a
}

// check returns who the presented token stands for, or ok false.
func (a *authenticator) check(presented string) (who principal, ok bool) {
	d := sha256.Sum256([]byte(presented))
	match := -1
	for i := range a.digests {
		eq := subtle.ConstantTimeCompare(d[:], a.digests[i][:])
		match = subtle.ConstantTimeSelect(eq, i, match)
	}
	if match < 0 {
		return principal{}, false
	}
	return a.who[match], true
}

// bearer extracts the token of an "Authorization: Bearer <token>" header.
func bearer(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}

// principal is who a request authenticated as: its token's name and
// scopes.
type principal struct {
	name   string
	scopes Scopes
}

type principalKey struct{}

// insecurePrincipal is every request of a handler built Insecure without
// tokens: no one is authenticated, so no one's identity can be checked.
var insecurePrincipal = principal{name: DefaultTokenName, scopes: ScopeAdmin}

// withPrincipal is ctx of a request that authenticated as who: the
// routes read who it is (principalOf), and the runs it commands spend
// who's limits (runs.WithCaller).
func withPrincipal(ctx context.Context, who principal) context.Context {
	return runs.WithCaller(context.WithValue(ctx, principalKey{}, who), who.name)
}

func principalOf(ctx context.Context) principal {
	if p, ok := ctx.Value(principalKey{}).(principal); ok {
		return p
	}
	return principal{name: DefaultTokenName} // no scopes: fails closed
}

// identity returns the name of the token that authenticated the request.
func identity(ctx context.Context) string { return principalOf(ctx).name }

// requireToken wraps next with bearer-token authentication. With insecure
// set and no tokens, every request passes as "api" with scope admin. With
// no tokens and insecure unset every request is refused: a handler built
// without tokens by mistake fails closed. A request without a bearer
// token may instead carry a web UI session cookie (browser.go).
func (h *handler) requireToken(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(h.auth.digests) == 0 {
			if h.cfg.Insecure {
				next.ServeHTTP(w, r.WithContext(withPrincipal(r.Context(), insecurePrincipal)))
				return
			}
			unauthorized(w, "", "this server has no API tokens configured (set PAL_API_TOKENS)")
			return
		}
		tok, ok := bearer(r)
		if !ok {
			if ctx, handled, ok := h.fromSession(w, r); ok {
				if !handled {
					next.ServeHTTP(w, r.WithContext(ctx))
				}
				return
			}
			if c, err := r.Cookie(SessionCookie); err == nil && c.Value != "" {
				unauthorized(w, "", "the browser session has ended (logged out, expired, or the server restarted): log in again at /login, or send 'Authorization: Bearer <token>'")
				return
			}
			unauthorized(w, "", "missing bearer token: send the header 'Authorization: Bearer <token>' with a token from PAL_API_TOKENS")
			return
		}
		who, ok := h.auth.check(tok)
		if !ok {
			unauthorized(w, `, error="invalid_token"`, "invalid bearer token")
			return
		}
		next.ServeHTTP(w, r.WithContext(withPrincipal(r.Context(), who)))
	})
}

// need wraps a route's handler: a request whose token lacks scope s is
// answered 403 before the handler reads anything.
func need(s Scopes, next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if who := principalOf(r.Context()); !who.scopes.Has(s) {
			writeError(w, http.StatusForbidden, codeForbidden, fmt.Sprintf("token %s lacks scope %s", who.name, s), "")
			return
		}
		next(w, r)
	}
}

func unauthorized(w http.ResponseWriter, extra, detail string) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="pal"`+extra)
	writeError(w, http.StatusUnauthorized, "unauthorized", detail, "")
}
