// Package egress is PAL's policy for outbound calls made on a run's behalf
// (the built-in http tool and the connectors): which addresses they may
// reach.
//
// By default a call may not reach loopback, link-local (the cloud metadata
// service included), private, shared (CGNAT), unspecified, multicast,
// broadcast or reserved addresses, nor any IPv6 form of those (IPv4-mapped,
// IPv4-compatible, NAT64). The check is made on the resolved address at
// connect time, by a dial function that resolves the host itself and dials
// only the addresses it checked: a name that resolves to a public address
// for the first lookup and a private one for the next (DNS rebinding) gains
// nothing, and a redirect is checked like the first request because every
// connection goes through the same dial.
//
// PAL_EGRESS_ALLOW opens exceptions: CIDRs, single addresses and host names
// (a listed name may resolve to any address).
//
// LLM provider base URLs are operator configuration and do not pass this
// policy.
package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
)

// EnvAllow is the variable that lists the exceptions.
const EnvAllow = "PAL_EGRESS_ALLOW"

// Address classes a Policy refuses by default.
const (
	ClassLoopback    = "loopback"
	ClassLinkLocal   = "link-local"
	ClassMetadata    = "link-local (cloud metadata service)"
	ClassPrivate     = "private"
	ClassShared      = "shared (CGNAT)"
	ClassUnspecified = "unspecified"
	ClassMulticast   = "multicast"
	ClassBroadcast   = "broadcast"
	ClassReserved    = "reserved"
)

// Loopback is what `pal dev` allows so that its tour can call local
// receivers.
var Loopback = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}

// denied lists the refused ranges, most specific first.
var denied = []struct {
	prefix netip.Prefix
	class  string
}{
	{netip.MustParsePrefix("169.254.169.254/32"), ClassMetadata},
	{netip.MustParsePrefix("fd00:ec2::254/128"), ClassMetadata},
	{netip.MustParsePrefix("255.255.255.255/32"), ClassBroadcast},
	{netip.MustParsePrefix("0.0.0.0/8"), ClassUnspecified},
	{netip.MustParsePrefix("::/128"), ClassUnspecified},
	{netip.MustParsePrefix("127.0.0.0/8"), ClassLoopback},
	{netip.MustParsePrefix("::1/128"), ClassLoopback},
	{netip.MustParsePrefix("169.254.0.0/16"), ClassLinkLocal},
	{netip.MustParsePrefix("fe80::/10"), ClassLinkLocal},
	{netip.MustParsePrefix("10.0.0.0/8"), ClassPrivate},
	{netip.MustParsePrefix("172.16.0.0/12"), ClassPrivate},
	{netip.MustParsePrefix("192.168.0.0/16"), ClassPrivate},
	{netip.MustParsePrefix("fc00::/7"), ClassPrivate},
	{netip.MustParsePrefix("100.64.0.0/10"), ClassShared},
	{netip.MustParsePrefix("224.0.0.0/4"), ClassMulticast},
	{netip.MustParsePrefix("ff00::/8"), ClassMulticast},
	{netip.MustParsePrefix("240.0.0.0/4"), ClassReserved},
}

// Embedding IPv6 ranges: the IPv4 address in their last 32 bits is what
// such an address reaches, so it is classified instead.
var (
	nat64      = netip.MustParsePrefix("64:ff9b::/96")
	compatible = netip.MustParsePrefix("::/96") // IPv4-compatible, deprecated
)

// Class returns the refused class of a, or "" for a public address.
func Class(a netip.Addr) string {
	a = a.Unmap().WithZone("")
	for _, d := range denied {
		if d.prefix.Contains(a) {
			return d.class
		}
	}
	if a.Is6() && (nat64.Contains(a) || compatible.Contains(a)) {
		b := a.As16()
		return Class(netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]}))
	}
	return ""
}

// Policy decides which addresses outbound calls may reach. The zero value
// and nil refuse every class; both are safe for concurrent use.
type Policy struct {
	prefixes []netip.Prefix
	hosts    []string // lower case, no trailing dot
}

// Parse reads a PAL_EGRESS_ALLOW value: comma-separated CIDRs
// ("10.0.0.0/8"), addresses ("127.0.0.1") and host names ("hooks.internal").
// An empty value allows nothing beyond public addresses.
func Parse(spec string) (*Policy, error) {
	p := &Policy{}
	for _, item := range strings.Split(spec, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		if strings.Contains(item, "/") {
			pfx, err := netip.ParsePrefix(item)
			if err != nil {
				return nil, fmt.Errorf("%s: %q is not a CIDR (want e.g. 10.0.0.0/8): %w", EnvAllow, item, err)
			}
			p.prefixes = append(p.prefixes, pfx.Masked())
			continue
		}
		if a, err := netip.ParseAddr(strings.Trim(item, "[]")); err == nil {
			p.prefixes = append(p.prefixes, netip.PrefixFrom(a.Unmap().WithZone(""), a.Unmap().BitLen()))
			continue
		}
		host := NormalHost(item)
		if !ValidHost(host) {
			return nil, fmt.Errorf("%s: %q is neither a CIDR, an address nor a host name", EnvAllow, item)
		}
		p.hosts = append(p.hosts, host)
	}
	return p, nil
}

// With returns a copy of p that also allows prefixes.
func (p *Policy) With(prefixes ...netip.Prefix) *Policy {
	out := &Policy{}
	if p != nil {
		out.prefixes = slices.Clone(p.prefixes)
		out.hosts = slices.Clone(p.hosts)
	}
	for _, pfx := range prefixes {
		out.prefixes = append(out.prefixes, pfx.Masked())
	}
	return out
}

// String lists the exceptions in PAL_EGRESS_ALLOW form.
func (p *Policy) String() string {
	if p == nil {
		return ""
	}
	items := make([]string, 0, len(p.prefixes)+len(p.hosts))
	for _, pfx := range p.prefixes {
		items = append(items, pfx.String())
	}
	return strings.Join(append(items, p.hosts...), ",")
}

// DeniedError is a call the policy refused. No retry can make it succeed.
type DeniedError struct {
	// Host is the host the call named (a name or an address literal).
	Host string
	// Addr is the refused address Host resolved to.
	Addr netip.Addr
	// Class is the address class, one of the Class constants.
	Class string
}

func (e *DeniedError) Error() string {
	what := e.Addr.String()
	if e.Host != "" && e.Host != what {
		what = fmt.Sprintf("%s (%s)", e.Host, what)
	}
	return fmt.Sprintf("egress refused: %s is a %s address, which PAL does not call by default; to allow it, add %s or the host name to %s",
		what, e.Class, e.Addr, EnvAllow)
}

// Check returns a *DeniedError if host, resolved to a, may not be called.
func (p *Policy) Check(host string, a netip.Addr) error {
	class := Class(a)
	if class == "" || p.allows(host, a) {
		return nil
	}
	return &DeniedError{Host: host, Addr: a.Unmap().WithZone(""), Class: class}
}

func (p *Policy) allows(host string, a netip.Addr) bool {
	if p == nil {
		return false
	}
	a = a.Unmap().WithZone("")
	for _, pfx := range p.prefixes {
		if pfx.Contains(a) {
			return true
		}
	}
	return host != "" && slices.Contains(p.hosts, NormalHost(host))
}

// DialFunc is the shape of net.Dialer.DialContext.
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// Resolver looks host names up; *net.Resolver is one.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Dial returns a dial function that resolves addr's host with r (nil:
// net.DefaultResolver), drops the addresses p refuses and dials the others
// in order with dial, by address, so nothing resolves the name again
// between the check and the connect. If every address is refused it
// returns the first *DeniedError and dials nothing.
func (p *Policy) Dial(dial DialFunc, r Resolver) DialFunc {
	if r == nil {
		r = net.DefaultResolver
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		var addrs []netip.Addr
		if a, err := netip.ParseAddr(host); err == nil {
			addrs = []netip.Addr{a}
		} else {
			ipNet := "ip"
			switch network {
			case "tcp4", "udp4":
				ipNet = "ip4"
			case "tcp6", "udp6":
				ipNet = "ip6"
			}
			if addrs, err = r.LookupNetIP(ctx, ipNet, host); err != nil {
				return nil, err
			}
		}
		var first, last error
		for _, a := range addrs {
			if err := p.Check(host, a); err != nil {
				first = cmpOr(first, err)
				continue
			}
			conn, err := dial(ctx, network, net.JoinHostPort(a.String(), port))
			if err == nil {
				return conn, nil
			}
			last = err
			if ctx.Err() != nil {
				break
			}
		}
		if last != nil {
			return nil, last
		}
		if first != nil {
			return nil, first
		}
		return nil, &net.DNSError{Err: "no addresses", Name: host, IsNotFound: true}
	}
}

func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// Secure makes c's transport pass p: it clones an *http.Transport (nil
// means http.DefaultTransport), wraps its dial with Dial and turns proxies
// off, since through a proxy the policy would only see the proxy's
// address. It refuses redirects to schemes other than http and https
// (the dial checks a redirect's address) unless c already has a
// CheckRedirect. A transport of another type is left as it is: its owner
// answers for it. It returns c for chaining.
func (p *Policy) Secure(c *http.Client) *http.Client {
	rt := c.Transport
	if rt == nil {
		rt = http.DefaultTransport
	}
	if tr, ok := rt.(*http.Transport); ok {
		tr = tr.Clone()
		inner := tr.DialContext
		if inner == nil {
			inner = (&net.Dialer{}).DialContext
		}
		tr.DialContext = p.Dial(inner, nil)
		tr.Proxy = nil
		c.Transport = tr
	}
	if c.CheckRedirect == nil {
		c.CheckRedirect = CheckRedirect
	}
	return c
}

// ErrRedirectScheme is returned for a redirect to a scheme other than http
// or https.
var ErrRedirectScheme = errors.New("redirect to a scheme other than http or https refused")

// CheckRedirect is an http.Client.CheckRedirect that allows at most 10
// redirects, to http and https URLs only.
func CheckRedirect(req *http.Request, via []*http.Request) error {
	if req.URL.Scheme != "http" && req.URL.Scheme != "https" {
		return fmt.Errorf("%w (%q)", ErrRedirectScheme, req.URL.Scheme)
	}
	if len(via) >= 10 {
		return errors.New("stopped after 10 redirects")
	}
	return nil
}

// NormalHost is h as the policy compares host names: lower case, without
// a trailing dot.
func NormalHost(h string) string { return strings.TrimSuffix(strings.ToLower(h), ".") }

// ValidHost reports whether h (normalized) looks like a DNS name: labels
// of letters, digits, '-' and '_', none empty, as the policy's and a
// secret's host lists take them.
func ValidHost(h string) bool {
	if h == "" || len(h) > 253 {
		return false
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}
