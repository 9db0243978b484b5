package api

import (
	"crypto/sha256"
	"encoding/hex"
	"net"
	"net/http"
	"net/netip"
	"time"

	"github.com/palrun/pal/internal/limit"
)

// DefaultLoginFailures bounds failed web UI logins: 10 a minute per
// client address and per token prefix, after which POST /login answers
// 429 with Retry-After, even for a right token, until the bucket refills
// (one more try every 6 s).
var DefaultLoginFailures = limit.Rate{N: 10, Per: time.Minute, Burst: 10}

// loginPrefixBytes is how much of a presented token keys its bound: enough
// to tell PAL's tokens apart ("pal_" and 4 random characters), so wrong
// guesses at one token slow down guesses at that token from every address
// without locking the others out.
const loginPrefixBytes = 8

// loginGuard bounds failed logins per client address and per token
// prefix: only failures spend, and a request that finds either of its
// buckets empty is refused before its token is checked, so a guesser
// learns nothing more, right token or not, until the bucket refills.
// Both are token buckets of limit.Buckets, so memory stays bounded
// whatever addresses and tokens arrive.
type loginGuard struct {
	addrs, prefixes *limit.Buckets
}

func newLoginGuard(r limit.Rate, now func() time.Time) *loginGuard {
	if r.Off() {
		r = DefaultLoginFailures
	}
	return &loginGuard{addrs: limit.NewBuckets(r, now), prefixes: limit.NewBuckets(r, now)}
}

// loginKey is what a login attempt is bounded by.
type loginKey struct{ addr, prefix string }

// loginKeyOf returns the keys of a login from r presenting token: the
// client's address (an IPv6 address by its /64, which one host usually
// holds whole) and a digest of the token's first loginPrefixBytes (no
// secret kept in memory). Behind a proxy every client has the proxy's
// address.
func loginKeyOf(r *http.Request, token string) loginKey {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	addr := host
	if ip, err := netip.ParseAddr(host); err == nil {
		ip = ip.Unmap()
		if ip.Is6() {
			if p, err := ip.Prefix(64); err == nil {
				addr = p.String()
			}
		} else {
			addr = ip.String()
		}
	}
	sum := sha256.Sum256([]byte(token[:min(len(token), loginPrefixBytes)]))
	return loginKey{addr: addr, prefix: hex.EncodeToString(sum[:8])}
}

// wait is how long k must wait before it may try a token (0: now).
func (g *loginGuard) wait(k loginKey) time.Duration {
	return max(g.addrs.Wait(k.addr), g.prefixes.Wait(k.prefix))
}

// failed spends one failure of k's address and of its prefix.
func (g *loginGuard) failed(k loginKey) {
	g.addrs.Take(k.addr)
	g.prefixes.Take(k.prefix)
}
