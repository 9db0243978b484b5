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
)

// DefaultTokenName is the identity of a token configured without a name.
const DefaultTokenName = "api"

// Token is one API bearer token and the identity it stands for: the name
// becomes the canceller of run_cancelled and the default approver.
type Token struct {
	Name   string
	Secret string
}

// ParseTokens parses PAL_API_TOKENS: comma-separated tokens, each either
// a bare token (named "api") or name=token. Blank entries are ignored. A
// token that itself contains '=' must be given with a name. Errors name
// the entry at fault without quoting the secret.
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
	names   []string
	digests [][sha256.Size]byte
}

func newAuthenticator(tokens []Token) *authenticator {
	a := &authenticator{}
	for _, t := range tokens {
		a.names = append(a.names, t.Name)
		a.digests = append(a.digests, sha256.Sum256([]byte(t.Secret)))
	}
	return a
}

// check returns the name of the token presented, or ok false.
func (a *authenticator) check(presented string) (name string, ok bool) {
	d := sha256.Sum256([]byte(presented))
	match := -1
	for i := range a.digests {
		eq := subtle.ConstantTimeCompare(d[:], a.digests[i][:])
		match = subtle.ConstantTimeSelect(eq, i, match)
	}
	if match < 0 {
		return "", false
	}
	return a.names[match], true
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

type identityKey struct{}

// identity returns the name of the token that authenticated the request.
func identity(ctx context.Context) string {
	if s, ok := ctx.Value(identityKey{}).(string); ok && s != "" {
		return s
	}
	return DefaultTokenName
}

// requireToken wraps next with bearer-token authentication. With insecure
// set and no tokens, every request passes as "api". With no tokens and
// insecure unset every request is refused: a handler built without tokens
// by mistake fails closed.
func (h *handler) requireToken(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(h.auth.digests) == 0 {
			if h.cfg.Insecure {
				next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), identityKey{}, DefaultTokenName)))
				return
			}
			unauthorized(w, "", "this server has no API tokens configured (set PAL_API_TOKENS)")
			return
		}
		tok, ok := bearer(r)
		if !ok {
			unauthorized(w, "", "missing bearer token: send the header 'Authorization: Bearer <token>' with a token from PAL_API_TOKENS")
			return
		}
		name, ok := h.auth.check(tok)
		if !ok {
			unauthorized(w, `, error="invalid_token"`, "invalid bearer token")
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), identityKey{}, name)))
	})
}

func unauthorized(w http.ResponseWriter, extra, detail string) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="pal"`+extra)
	writeError(w, http.StatusUnauthorized, "unauthorized", detail, "")
}
