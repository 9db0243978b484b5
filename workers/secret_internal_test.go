package workers

import (
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"
)

// A bound host matches the destination's host as written (lower case, no
// trailing dot; no subdomain), an address as an address, and its port
// when it names one (the scheme's when the URL names none).
func TestSecretHostMatches(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		bound, url string
		ok         bool
	}{
		{"api.example.com", "https://API.Example.com./x", true},
		{"api.example.com", "http://api.example.com:9999/x", true},
		{"api.example.com", "https://sub.api.example.com/x", false},
		{"api.example.com", "https://api.example.com.evil.test/x", false},
		{"api.example.com:443", "https://api.example.com/x", true},
		{"api.example.com:443", "http://api.example.com/x", false},
		{"api.example.com:8443", "https://api.example.com:8443/x", true},
		{"[::1]:8080", "http://[0:0::1]:8080/", true},
		{"::1", "http://[::1]:1/", true},
		{"127.0.0.1", "http://[::ffff:127.0.0.1]:80/", true},
		{"127.0.0.1", "http://127.0.0.2/", false},
	} {
		hosts, err := ParseSecretHosts(tc.bound)
		require.NoError(t, err, tc.bound)
		u, err := url.Parse(tc.url)
		require.NoError(t, err)
		host, port := destination(u)
		require.Equal(t, tc.ok, hosts[0].matches(host, port), "%s → %s", tc.bound, tc.url)
	}
}
