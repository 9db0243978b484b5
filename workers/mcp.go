package workers

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/palrun/pal/internal/egress"
	"github.com/palrun/pal/internal/redact"
	"github.com/palrun/pal/internal/sandbox"
)

// MCP servers (docs/architecture.md §10.4): the worker is an MCP client of
// the servers of its PAL_MCP_CONFIG (mcp_config.go), through the official
// Go SDK.
//
//   - A connection is made at a server's first use, kept and reused by
//     every run the worker drives, made again after it broke, and closed
//     when the worker stops.
//   - A stdio server runs in the sandbox of process steps (its own
//     namespaces, network none unless the entry says egress); it dies
//     with the worker, even by kill -9. An HTTP server is reached through
//     the worker's egress policy: a refused address fails the call, not
//     retryable.
//   - Each call is a step: it carries the step's idempotency key in its
//     _meta as "pal/idempotencyKey", so a server can make a call that
//     comes again after a crash (the same attempt, the same key) a no-op.
//   - A server that does not start, does not answer in time or crashes
//     fails the call with a retryable error (class tool, or timeout); a
//     tool that answers isError fails it, not retryable; the worker goes
//     on.

// MCPKeyMeta is the _meta field of a tools/call request that carries the
// step's idempotency key.
const MCPKeyMeta = "pal/idempotencyKey"

// Bounds of the MCP client.
const (
	// mcpConnectTimeout bounds starting a server and its handshake.
	mcpConnectTimeout = 30 * time.Second
	// maxMCPTools bounds the tools one server's list may offer an agent.
	maxMCPTools = 256
	// mcpStderrTail is how much of a stdio server's stderr an error quotes.
	mcpStderrTail = 2 << 10
)

// providerToolName is the form providers take a tool's name in.
var providerToolName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// mcpClients are a worker's connections to its MCP servers.
type mcpClients struct {
	w   *Worker
	cfg *MCPConfig

	mu     sync.Mutex
	conns  map[string]*mcpEntry
	closed bool
}

// mcpEntry holds the connection to one server; its mutex is held while
// the connection is made, so a server is started once at a time.
type mcpEntry struct {
	mu   sync.Mutex
	conn *mcpConn
}

// mcpConn is one live connection.
type mcpConn struct {
	sess   *mcp.ClientSession
	proc   *sandbox.Process // a stdio server's; nil for HTTP
	stderr *tail
	dead   chan struct{} // closed when the session has ended
}

func (c *mcpConn) alive() bool {
	select {
	case <-c.dead:
		return false
	default:
		return true
	}
}

// close ends the session and, for a stdio server, its processes.
func (c *mcpConn) close() {
	_ = c.sess.Close()
	if c.proc == nil {
		return
	}
	c.proc.Terminate()
	select {
	case <-c.proc.Done():
	case <-time.After(ProcessGrace):
		c.proc.Kill()
	}
	_ = c.proc.Close()
}

func newMCPClients(w *Worker, cfg *MCPConfig) *mcpClients {
	return &mcpClients{w: w, cfg: cfg, conns: map[string]*mcpEntry{}}
}

// server returns the configured server name, or a permanent error naming
// the configured ones.
func (m *mcpClients) server(name string) (MCPServer, error) {
	if m.cfg != nil {
		if s, ok := m.cfg.Servers[name]; ok {
			return s, nil
		}
	}
	return MCPServer{}, permanent("MCP server %q is not in worker %s's %s (configured: %s)", name, m.w.cfg.ID, EnvMCPConfig, m.cfg.names())
}

// session returns the live connection to s, made now when there is none
// or the last one broke.
func (m *mcpClients) session(ctx context.Context, s MCPServer) (*mcpConn, error) {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, errShutdown
	}
	e := m.conns[s.Name]
	if e == nil {
		e = &mcpEntry{}
		m.conns[s.Name] = e
	}
	m.mu.Unlock()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.conn != nil && e.conn.alive() {
		return e.conn, nil
	}
	if e.conn != nil {
		e.conn.close()
		e.conn = nil
	}
	c, err := m.connect(ctx, s)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		c.close()
		return nil, errShutdown
	}
	e.conn = c
	return c, nil
}

// drop closes c if it is still the server's connection: the next call
// makes a new one.
func (m *mcpClients) drop(name string, c *mcpConn) {
	m.mu.Lock()
	e := m.conns[name]
	m.mu.Unlock()
	if e == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.conn == c {
		e.conn.close()
		e.conn = nil
	}
}

// close closes every connection; later calls fail. Idempotent.
func (m *mcpClients) close() {
	m.mu.Lock()
	m.closed = true
	entries := make([]*mcpEntry, 0, len(m.conns))
	for _, e := range m.conns {
		entries = append(entries, e)
	}
	m.mu.Unlock()
	for _, e := range entries {
		e.mu.Lock()
		if e.conn != nil {
			e.conn.close()
			e.conn = nil
		}
		e.mu.Unlock()
	}
}

// unavailable is a server that could not be reached or broke: retryable.
func unavailable(s MCPServer, format string, args ...any) error {
	return &ToolError{Err: fmt.Errorf("MCP server %s: "+format, append([]any{s.Name}, args...)...), Retryable: true}
}

// connect starts (stdio) or reaches (HTTP) the server and makes the MCP
// handshake, within mcpConnectTimeout.
func (m *mcpClients) connect(ctx context.Context, s MCPServer) (*mcpConn, error) {
	ctx, cancel := context.WithTimeout(ctx, mcpConnectTimeout)
	defer cancel()
	client := mcp.NewClient(&mcp.Implementation{Name: "pal", Version: "1"},
		&mcp.ClientOptions{Capabilities: &mcp.ClientCapabilities{}})
	c := &mcpConn{dead: make(chan struct{})}
	var transport mcp.Transport
	var err error
	if s.stdio() {
		transport, err = m.startStdio(s, c)
	} else {
		transport, err = m.httpTransport(s)
	}
	if err != nil {
		return nil, err
	}
	sess, err := client.Connect(ctx, transport, nil)
	if err != nil {
		what := "the MCP handshake failed"
		if c.proc != nil {
			c.proc.Kill()
			<-c.proc.Done()
			_ = c.proc.Close()
			if r := c.proc.Result(); !r.OK() {
				what = fmt.Sprintf("exited (code %d, signal %d) before the handshake", r.ExitCode, r.Signal)
			}
		}
		if egressDenied(err) {
			return nil, &ToolError{Err: fmt.Errorf("MCP server %s: %w", s.Name, err)}
		}
		if cause := context.Cause(ctx); cause != nil && errors.Is(cause, context.DeadlineExceeded) {
			return nil, unavailable(s, "no answer to the handshake within %s", mcpConnectTimeout)
		}
		return nil, unavailable(s, "%s: %v%s", what, redact.Error(err), c.stderrTail())
	}
	c.sess = sess
	go func() {
		_ = sess.Wait()
		close(c.dead)
	}()
	return c, nil
}

// stderrTail quotes the end of a stdio server's stderr, for errors.
func (c *mcpConn) stderrTail() string {
	if c.stderr == nil {
		return ""
	}
	if t := strings.TrimSpace(c.stderr.String()); t != "" {
		return "; its stderr ends: " + t
	}
	return ""
}

// startStdio starts a stdio server in a sandbox and returns the transport
// over its standard input and output.
func (m *mcpClients) startStdio(s MCPServer, c *mcpConn) (mcp.Transport, error) {
	w := m.w
	sb, err := w.sandboxRunner("stdio MCP servers")
	if err != nil {
		return nil, permanent("MCP server %s: %v", s.Name, err)
	}
	path, err := sb.Resolve(s.Command)
	if errors.Is(err, sandbox.ErrNotAllowed) {
		return nil, permanent("MCP server %s: %v: add it to %s to run it", s.Name, err, EnvProcessPrograms)
	} else if err != nil {
		return nil, unavailable(s, "%v", err)
	}
	env := make([]string, 0, len(s.Env))
	for k, v := range s.Env {
		val, err := m.expand(s, v)
		if err != nil {
			return nil, fmt.Errorf("MCP server %s: env.%s: %w", s.Name, k, err)
		}
		env = append(env, k+"="+val)
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return nil, err
	}
	c.stderr = &tail{max: mcpStderrTail}
	network := sandbox.NetworkNone
	if s.Network == string(sandbox.NetworkEgress) {
		network = sandbox.NetworkEgress
	}
	proc, err := sb.Prepare(sandbox.Spec{Argv: append([]string{path}, s.Args...), Env: env, Network: network,
		Dial: sandbox.DialFunc(w.cfg.Egress.Dial((&net.Dialer{}).DialContext, nil)), Limits: sandboxLimits(nil),
		Stdin: inR, Stdout: outW, Stderr: c.stderr})
	if err == nil {
		err = proc.Start()
		if err != nil {
			_ = proc.Close()
		}
	}
	inR.Close()
	outW.Close()
	if err != nil {
		inW.Close()
		outR.Close()
		return nil, unavailable(s, "starting %s: %v", s.Command, err)
	}
	c.proc = proc
	w.log.Info("MCP server started", "mcp", s.Name, "pid", proc.Pid())
	return &mcp.IOTransport{Reader: outR, Writer: inW}, nil
}

// headerTransport sends a server's headers with each request.
type headerTransport struct {
	next    http.RoundTripper
	headers map[string]string
}

func (t *headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range t.headers {
		r.Header.Set(k, v)
	}
	return t.next.RoundTrip(r)
}

// httpTransport is the streamable-HTTP transport to s, through the
// worker's egress policy, with its headers (secrets resolved, and bound
// to the URL's host).
func (m *mcpClients) httpTransport(s MCPServer) (mcp.Transport, error) {
	headers := make(map[string]string, len(s.Headers))
	sec := &secrets{hosts: m.w.cfg.SecretHosts}
	for k, v := range s.Headers {
		val, err := m.expand(s, v)
		if err != nil {
			return nil, fmt.Errorf("MCP server %s: headers.%s: %w", s.Name, k, err)
		}
		headers[k] = val
	}
	sec.names = s.secretNames()
	u, _ := url.Parse(s.URL) // checked by ParseMCPConfig
	if err := sec.allowTo(u); err != nil {
		return nil, fmt.Errorf("MCP server %s: %w", s.Name, err)
	}
	client := m.w.cfg.Egress.Secure(&http.Client{})
	client.Transport = &headerTransport{next: client.Transport, headers: headers}
	client.CheckRedirect = func(*http.Request, []*http.Request) error {
		return errors.New("an MCP server's URL is where it is: redirects are not followed")
	}
	return &mcp.StreamableClientTransport{Endpoint: s.URL, HTTPClient: client, MaxRetries: -1, DisableStandaloneSSE: true}, nil
}

// expand resolves the {{secrets.NAME}} of a server's env or header value
// from the worker's secrets (PAL_SECRET_NAME).
func (m *mcpClients) expand(s MCPServer, v string) (string, error) {
	var err error
	out := definedRef.ReplaceAllStringFunc(v, func(ref string) string {
		name := definedRef.FindStringSubmatch(ref)[1]
		val, ok := m.w.cfg.Secrets(name)
		if !ok && err == nil {
			err = permanent("secret %s is not set on worker %s: set %s%s", name, m.w.cfg.ID, SecretEnvPrefix, name)
		}
		return val
	})
	return out, err
}

// sandboxRunner is the worker's sandbox (Config.Sandbox, or one with the
// defaults made at first use); what runs in it (what: "process steps")
// names the error of a worker that has none.
func (w *Worker) sandboxRunner(what string) (*sandbox.Runner, error) {
	w.sbOnce.Do(func() {
		if w.sb = w.cfg.Sandbox; w.sb == nil {
			w.sb, w.sbErr = sandbox.New(sandbox.Config{Logger: w.log})
		}
	})
	if w.sbErr != nil {
		return nil, w.sbErr
	}
	if err := w.sb.Available(); err != nil {
		return nil, fmt.Errorf("%s run in a sandbox, and this worker has none: %v. Install bubblewrap where the worker runs "+
			"(Debian, Ubuntu: apt-get install bubblewrap), or set %s=off to run programs unconfined as the worker's user (unsafe)",
			what, err, EnvProcessSandbox)
	}
	return w.sb, nil
}

// egressDenied reports whether err is the egress policy's refusal.
func egressDenied(err error) bool {
	var de *egress.DeniedError
	return errors.As(err, &de)
}
