package egress_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/palrun/pal/internal/egress"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestClass(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]string{
		"8.8.8.8":                   "",
		"2606:4700::1111":           "",
		"172.32.0.1":                "",
		"100.128.0.1":               "",
		"127.0.0.1":                 egress.ClassLoopback,
		"127.255.255.254":           egress.ClassLoopback,
		"::1":                       egress.ClassLoopback,
		"169.254.169.254":           egress.ClassMetadata,
		"fd00:ec2::254":             egress.ClassMetadata,
		"169.254.1.1":               egress.ClassLinkLocal,
		"fe80::1":                   egress.ClassLinkLocal,
		"fe80::1%eth0":              egress.ClassLinkLocal,
		"10.1.2.3":                  egress.ClassPrivate,
		"172.16.0.1":                egress.ClassPrivate,
		"172.31.255.255":            egress.ClassPrivate,
		"192.168.1.1":               egress.ClassPrivate,
		"fc00::1":                   egress.ClassPrivate,
		"fd12:3456::1":              egress.ClassPrivate,
		"100.64.0.1":                egress.ClassShared,
		"0.0.0.0":                   egress.ClassUnspecified,
		"::":                        egress.ClassUnspecified,
		"224.0.0.1":                 egress.ClassMulticast,
		"ff02::1":                   egress.ClassMulticast,
		"255.255.255.255":           egress.ClassBroadcast,
		"240.0.0.1":                 egress.ClassReserved,
		"::ffff:127.0.0.1":          egress.ClassLoopback,
		"::ffff:169.254.169.254":    egress.ClassMetadata,
		"::ffff:10.0.0.1":           egress.ClassPrivate,
		"::ffff:0.0.0.0":            egress.ClassUnspecified,
		"::127.0.0.1":               egress.ClassLoopback,
		"64:ff9b::a9fe:a9fe":        egress.ClassMetadata,
		"64:ff9b::192.168.0.1":      egress.ClassPrivate,
		"64:ff9b::8.8.8.8":          "",
		"::ffff:8.8.8.8":            "",
		"2001:db8::ffff:127.0.0.1":  "", // not an embedding range
		"::ffff:192.168.100.200%lo": egress.ClassPrivate,
	} {
		require.Equal(t, want, egress.Class(netip.MustParseAddr(addr)), addr)
	}
}

func TestParse(t *testing.T) {
	t.Parallel()
	p, err := egress.Parse(" 127.0.0.1/32, 10.0.0.0/8 ,hooks.Internal., ::1, 192.168.1.7 ,,")
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1/32,10.0.0.0/8,::1/128,192.168.1.7/32,hooks.internal", p.String())

	for _, tc := range []struct {
		host, addr string
		class      string // "" when allowed
	}{
		{"127.0.0.1", "127.0.0.1", ""},
		{"localhost", "127.0.0.2", egress.ClassLoopback},
		{"x", "::ffff:127.0.0.1", ""},
		{"x", "10.9.8.7", ""},
		{"HOOKS.internal", "172.16.0.9", ""},
		{"hooks.internal.", "169.254.169.254", ""},
		{"other.internal", "172.16.0.9", egress.ClassPrivate},
		{"x", "192.168.1.7", ""},
		{"x", "192.168.1.8", egress.ClassPrivate},
		{"x", "169.254.169.254", egress.ClassMetadata},
		{"x", "8.8.8.8", ""},
	} {
		err := p.Check(tc.host, netip.MustParseAddr(tc.addr))
		if tc.class == "" {
			require.NoError(t, err, "%s %s", tc.host, tc.addr)
			continue
		}
		var de *egress.DeniedError
		require.ErrorAs(t, err, &de, "%s %s", tc.host, tc.addr)
		require.Equal(t, tc.class, de.Class)
		require.ErrorContains(t, err, egress.EnvAllow)
	}

	for _, bad := range []string{"10.0.0.0/33", "10.0.0/8", "exa mple.com", "http://x.example", "a..b", "*.example.com"} {
		_, err := egress.Parse(bad)
		require.ErrorContains(t, err, egress.EnvAllow, bad)
		require.ErrorContains(t, err, bad)
	}
}

func TestNilAndDefaultRefuseEveryClass(t *testing.T) {
	t.Parallel()
	var nilPolicy *egress.Policy
	for _, p := range []*egress.Policy{nilPolicy, {}} {
		err := p.Check("metadata.google.internal", netip.MustParseAddr("169.254.169.254"))
		require.EqualError(t, err, "egress refused: metadata.google.internal (169.254.169.254) is a link-local (cloud metadata service) address, "+
			"which PAL does not call by default; to allow it, add 169.254.169.254 or the host name to PAL_EGRESS_ALLOW")
		require.NoError(t, p.Check("example.com", netip.MustParseAddr("93.184.215.14")))
	}
	require.NoError(t, nilPolicy.With(egress.Loopback...).Check("", netip.MustParseAddr("::1")))
	require.Empty(t, nilPolicy.String())
}

// fakeResolver answers every name with the same addresses, and counts.
type fakeResolver struct {
	addrs []netip.Addr
	calls atomic.Int32
}

func (r *fakeResolver) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	r.calls.Add(1)
	return r.addrs, nil
}

func TestDialChecksEveryResolvedAddress(t *testing.T) {
	t.Parallel()
	var dialled []string
	dial := func(_ context.Context, _, addr string) (net.Conn, error) {
		dialled = append(dialled, addr)
		return nil, errors.New("stop here")
	}
	r := &fakeResolver{addrs: []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("93.184.215.14"), netip.MustParseAddr("::ffff:169.254.169.254")}}
	_, err := (&egress.Policy{}).Dial(dial, r)(t.Context(), "tcp", "rebind.example:80")
	require.EqualError(t, err, "stop here")
	require.Equal(t, []string{"93.184.215.14:80"}, dialled, "only the public address is dialled, by address")

	// Every address refused: nothing is dialled.
	dialled = nil
	r.addrs = r.addrs[:1]
	_, err = (&egress.Policy{}).Dial(dial, r)(t.Context(), "tcp", "rebind.example:80")
	var de *egress.DeniedError
	require.ErrorAs(t, err, &de)
	require.Equal(t, egress.ClassPrivate, de.Class)
	require.Empty(t, dialled)

	// An address literal is not looked up.
	calls := r.calls.Load()
	_, err = (&egress.Policy{}).Dial(dial, r)(t.Context(), "tcp", "[::1]:80")
	require.ErrorAs(t, err, &de)
	require.Equal(t, egress.ClassLoopback, de.Class)
	require.Equal(t, calls, r.calls.Load())
	require.Empty(t, dialled)
}

func TestSecureRefusesLoopbackBeforeConnecting(t *testing.T) {
	t.Parallel()
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits.Add(1) }))
	t.Cleanup(srv.Close)
	c := (&egress.Policy{}).Secure(&http.Client{})
	t.Cleanup(c.CloseIdleConnections)
	_, err := c.Get(srv.URL)
	var de *egress.DeniedError
	require.ErrorAs(t, err, &de)
	require.Equal(t, egress.ClassLoopback, de.Class)
	require.Zero(t, hits.Load())

	allowed := (&egress.Policy{}).With(egress.Loopback...).Secure(&http.Client{})
	t.Cleanup(allowed.CloseIdleConnections)
	resp, err := allowed.Get(srv.URL)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.EqualValues(t, 1, hits.Load())
}

// An allowed host that redirects to a refused address gets no second
// request through: the redirect's connection passes the same check.
func TestRedirectToRefusedAddress(t *testing.T) {
	t.Parallel()
	var inner atomic.Int32
	target := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { inner.Add(1) }))
	t.Cleanup(target.Close)
	redirector := httptest.NewServer(http.RedirectHandler(target.URL+"/admin", http.StatusFound))
	t.Cleanup(redirector.Close)

	p, err := egress.Parse("hooks.test")
	require.NoError(t, err)
	r := &fakeResolver{addrs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}}
	tr := &http.Transport{DialContext: p.Dial((&net.Dialer{}).DialContext, r)}
	t.Cleanup(tr.CloseIdleConnections)
	c := &http.Client{Transport: tr, CheckRedirect: egress.CheckRedirect}

	_, port, _ := net.SplitHostPort(strings.TrimPrefix(redirector.URL, "http://"))
	_, err = c.Get("http://hooks.test:" + port + "/hook")
	var de *egress.DeniedError
	require.ErrorAs(t, err, &de, "the redirect to %s must be refused", target.URL)
	require.Equal(t, "127.0.0.1", de.Host)
	require.Zero(t, inner.Load())

	// A redirect to another scheme is refused by CheckRedirect.
	ftp := httptest.NewServer(http.RedirectHandler("ftp://files.example/x", http.StatusFound))
	t.Cleanup(ftp.Close)
	c2 := (&egress.Policy{}).With(egress.Loopback...).Secure(&http.Client{})
	t.Cleanup(c2.CloseIdleConnections)
	_, err = c2.Get(ftp.URL)
	require.ErrorIs(t, err, egress.ErrRedirectScheme)
}
