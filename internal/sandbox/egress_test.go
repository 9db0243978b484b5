package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/internal/sandbox"
)

// TestSandboxEgress: with NetworkEgress, connections through the proxy go
// where the step's dial allows (plain HTTP and CONNECT) and nowhere else;
// a connection that does not use the proxy has no route; NetworkNone has
// no proxy.
func TestSandboxEgress(t *testing.T) {
	t.Parallel()
	var hits atomic.Int64
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		fmt.Fprint(w, "hello "+r.URL.Path)
	})}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	var dialed atomic.Int64
	// The dial allows 127.0.0.2 only, and names "allowed.test" for it, as
	// an egress policy would.
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, p, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		if host == "allowed.test" {
			host = "127.0.0.2"
		}
		if host != "127.0.0.2" {
			return nil, errors.New("egress refused: " + host + " is not allowed")
		}
		dialed.Add(1)
		return (&net.Dialer{}).DialContext(ctx, network, net.JoinHostPort(host, p))
	}
	r := newRunner(t, sandbox.Config{})
	script := `
import http.client, json, os, socket, urllib.request, urllib.error
port = int(os.environ["PORT"])
out = {"proxy": os.environ.get("HTTPS_PROXY", "")}
def get(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return "%d %s" % (r.status, r.read().decode())
    except urllib.error.HTTPError as e:
        return "%d %s" % (e.code, e.read().decode().strip()[:120])
    except Exception as e:
        return type(e).__name__
out["allowed"] = get("http://127.0.0.2:%d/plain" % port)
out["by name"] = get("http://allowed.test:%d/named" % port)
out["nats"] = get("http://127.0.0.1:4222/")
out["metadata"] = get("http://169.254.169.254/latest/meta-data/")
try:
    c = http.client.HTTPConnection("127.0.0.1", 3128, timeout=10)
    c.set_tunnel("127.0.0.2", port)
    c.request("GET", "/tunnel")
    r = c.getresponse()
    out["tunnel"] = "%d %s" % (r.status, r.read().decode())
except Exception as e:
    out["tunnel"] = type(e).__name__ + ": " + str(e)
try:
    c = http.client.HTTPConnection("127.0.0.1", 3128, timeout=10)
    c.set_tunnel("169.254.169.254", 80)
    c.request("GET", "/")
    out["tunnel metadata"] = "got %d" % c.getresponse().status
except Exception as e:
    out["tunnel metadata"] = type(e).__name__
try:
    socket.create_connection(("127.0.0.2", port), timeout=2)
    out["direct"] = "connected"
except OSError as e:
    out["direct"] = type(e).__name__
print(json.dumps(out))
`
	var got map[string]string
	pyJSON(t, r, sandbox.Spec{Network: sandbox.NetworkEgress, Dial: dial, Env: []string{"PORT=" + port}}, script, &got)
	require.Equal(t, "http://"+sandbox.ProxyAddr, got["proxy"])
	require.Equal(t, "200 hello /plain", got["allowed"])
	require.Equal(t, "200 hello /named", got["by name"])
	require.Contains(t, got["nats"], "403 connecting to 127.0.0.1:4222: egress refused")
	require.Contains(t, got["metadata"], "403 connecting to 169.254.169.254")
	require.Equal(t, "200 hello /tunnel", got["tunnel"])
	require.Equal(t, "OSError", got["tunnel metadata"]) // Tunnel connection failed: 403
	require.Contains(t, []string{"OSError", "ConnectionRefusedError"}, got["direct"])
	require.EqualValues(t, 3, hits.Load())
	require.EqualValues(t, 3, dialed.Load())

	// Without egress: no proxy, no route.
	pyJSON(t, r, sandbox.Spec{Dial: dial, Env: []string{"PORT=" + port}}, script, &got)
	require.Empty(t, got["proxy"])
	for _, k := range []string{"allowed", "by name", "tunnel", "direct"} {
		require.NotContains(t, got[k], "200", k)
	}
	require.EqualValues(t, 3, hits.Load())
}

// TestSandboxOff: without a sandbox the program runs as the worker's
// user in a fresh work directory, with its limits as rlimits and its
// descendants in the step's cgroup.
func TestSandboxOff(t *testing.T) {
	t.Parallel()
	r := newRunner(t, sandbox.Config{Off: true})
	require.Contains(t, r.Describe(), "unsafe")
	var got struct {
		Home, Cwd string
		UID       int
		Error     string
	}
	pyJSON(t, r, sandbox.Spec{Limits: sandbox.Limits{FileSize: 1 << 20}}, `
import json, os
err = ""
try:
    open("big", "wb").write(b"x" * (2 << 20))
except OSError as e:
    err = str(e)
print(json.dumps({"Home": os.environ["HOME"], "Cwd": os.getcwd(), "UID": os.getuid(), "Error": err}))`, &got)
	require.Equal(t, got.Home, got.Cwd)
	require.Contains(t, got.Home, "pal-sbx-")
	require.Equal(t, os.Getuid(), got.UID) // the worker's: unsafe
	require.Contains(t, got.Error, "File too large")
}
