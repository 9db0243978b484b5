package testenv

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/palrun/pal/eventstore/natsauth"
)

// NATSOption configures NATS and NATSProcess.
type NATSOption func(*natsConfig)

type natsConfig struct {
	strict  bool
	port    int
	logging bool
	roles   bool
	users   natsauth.Users
}

// Strict makes JetStream fsync every write before acknowledging it (PAL's
// PAL_DURABILITY=strict), instead of syncing periodically.
func Strict() NATSOption { return func(c *natsConfig) { c.strict = true } }

// Port makes the server listen on port (on 127.0.0.1) instead of a random
// one.
func Port(port int) NATSOption { return func(c *natsConfig) { c.port = port } }

// Logging sends the embedded server's log to the test log (t.Logf). Debug
// and trace output stay off. It has no effect on NATSProcess, whose output is
// always captured and logged when the test fails.
func Logging() NATSOption { return func(c *natsConfig) { c.logging = true } }

// Roles turns authentication on with PAL's NATS accounts, as pal dev sets
// them up (eventstore/natsauth): one fresh nkey user per role of PAL's
// account and the client account's natsauth.DefaultUser (natsauth.ClientScopes).
// ConnAs connects as a role, ConnAsUser as a client user, and Conn as
// admin. Only NATS (embedded) takes it.
func Roles() NATSOption { return func(c *natsConfig) { c.roles = true } }

// ClientUsers adds client users to Roles' client account, each with a
// fresh nkey (their Nkey is filled in): Users lists them for PAL's
// processes.
func ClientUsers(users ...natsauth.User) NATSOption {
	return func(c *natsConfig) { c.roles, c.users = true, append(c.users, users...) }
}

func newNATSConfig(opts []NATSOption) natsConfig {
	var c natsConfig
	for _, o := range opts {
		o(&c)
	}
	return c
}

// NATSServer is a JetStream server embedded in the test process.
type NATSServer struct {
	opts   server.Options
	logger server.Logger  // nil: no logging
	keys   *natsauth.Keys // with Roles
	users  natsauth.Users // with Roles: the client users, nkeys filled in

	mu    sync.Mutex
	srv   *server.Server
	url   string
	conns []*nats.Conn // from Conn; Restart waits for them to reconnect
}

// NATS starts a JetStream server inside the test process: file storage in a
// fresh t.TempDir(), listening on 127.0.0.1 on a random port (or Port's),
// without signal handlers or logging. The test's cleanup shuts it down and
// waits until it has stopped.
func NATS(tb testing.TB, opts ...NATSOption) *NATSServer {
	tb.Helper()
	cfg := newNATSConfig(opts)
	port := cfg.port
	if port == 0 {
		port = server.RANDOM_PORT
	}
	n := &NATSServer{}
	if cfg.roles {
		names := make([]string, len(cfg.users))
		for i, u := range cfg.users {
			names[i] = u.Name
		}
		keys, err := natsauth.NewKeys(names...)
		if err != nil {
			tb.Fatalf("testenv: %v", err)
		}
		if n.users, err = keys.Users(cfg.users); err != nil {
			tb.Fatalf("testenv: %v", err)
		}
		opts, err := keys.ServerOptions(n.users)
		if err != nil {
			tb.Fatalf("testenv: %v", err)
		}
		n.keys, n.opts = keys, *opts
	}
	n.opts.ServerName, n.opts.Host, n.opts.Port = "pal-test", "127.0.0.1", port
	n.opts.NoSigs, n.opts.NoLog, n.opts.JetStream = true, !cfg.logging, true
	n.opts.StoreDir, n.opts.SyncAlways = tb.TempDir(), cfg.strict
	if cfg.logging {
		n.logger = tbLogger{tb}
	}
	if err := n.start(); err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	tb.Cleanup(n.Shutdown)
	return n
}

// start runs a server with n.opts. After the first start the port is fixed,
// so clients reconnect to the same address after a Restart.
func (n *NATSServer) start() error {
	opts := n.opts // NewServer keeps a pointer; give each server its own copy.
	srv, err := server.NewServer(&opts)
	if err != nil {
		return fmt.Errorf("creating the embedded NATS server: %w", err)
	}
	if n.logger != nil {
		srv.SetLoggerV2(n.logger, false, false, false)
	}
	srv.Start()
	if !srv.ReadyForConnections(30 * time.Second) {
		srv.Shutdown()
		srv.WaitForShutdown()
		return fmt.Errorf("the embedded NATS server on %s:%d did not become ready in 30s", n.opts.Host, n.opts.Port)
	}
	if !srv.JetStreamEnabled() {
		srv.Shutdown()
		srv.WaitForShutdown()
		return fmt.Errorf("the embedded NATS server started without JetStream (store dir %s)", n.opts.StoreDir)
	}
	addr, ok := srv.Addr().(*net.TCPAddr)
	if !ok {
		srv.Shutdown()
		srv.WaitForShutdown()
		return fmt.Errorf("the embedded NATS server has no TCP listener")
	}
	n.mu.Lock()
	n.srv = srv
	n.opts.Port = addr.Port
	n.url = "nats://" + net.JoinHostPort(n.opts.Host, strconv.Itoa(addr.Port))
	n.mu.Unlock()
	return nil
}

// URL returns the client URL, nats://127.0.0.1:<port>. It stays the same
// across Restart.
func (n *NATSServer) URL() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.url
}

// Server returns the running server (a new one after each Restart).
func (n *NATSServer) Server() *server.Server {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.srv
}

// Conn connects to the server. The connection reconnects forever, retrying
// every 25ms, so it survives Restart; opts are applied after those defaults.
// The test's cleanup closes it.
func (n *NATSServer) Conn(tb testing.TB, opts ...nats.Option) *nats.Conn {
	tb.Helper()
	if n.keys != nil {
		opts = append([]nats.Option{n.keys.Option(natsauth.Admin)}, opts...)
	}
	return n.conn(tb, opts)
}

// conn connects with opts, and registers the connection for Restart.
func (n *NATSServer) conn(tb testing.TB, opts []nats.Option) *nats.Conn {
	tb.Helper()
	nc := connect(tb, n.URL(), opts)
	n.mu.Lock()
	n.conns = append(n.conns, nc)
	n.mu.Unlock()
	return nc
}

// ConnAs connects as Conn does, authenticated as role. The server must
// have been started with Roles.
func (n *NATSServer) ConnAs(tb testing.TB, role natsauth.Role, opts ...nats.Option) *nats.Conn {
	tb.Helper()
	if n.keys == nil {
		tb.Fatalf("testenv: ConnAs(%s) on a server started without Roles", role)
	}
	return n.conn(tb, append([]nats.Option{n.keys.Option(role)}, opts...))
}

// ConnAsUser connects as Conn does, authenticated as the client user
// name (natsauth.DefaultUser, or one of ClientUsers).
func (n *NATSServer) ConnAsUser(tb testing.TB, name string, opts ...nats.Option) *nats.Conn {
	tb.Helper()
	if _, ok := n.users.ByName(name); !ok {
		tb.Fatalf("testenv: ConnAsUser(%s): no such client user (ClientUsers)", name)
	}
	return n.conn(tb, append([]nats.Option{n.keys.UserOption(name)}, opts...))
}

// Keys returns the roles' nkeys (nil without Roles), for a test that
// writes a seed file or starts a process as a role.
func (n *NATSServer) Keys() *natsauth.Keys { return n.keys }

// Users returns the client users with their nkeys (nil without Roles):
// what PAL's processes are given (runs.WithUsers, PAL_NATS_USERS).
func (n *NATSServer) Users() natsauth.Users { return n.users }

// Restart shuts the server down, waits until it has stopped and starts a new
// one on the same port with the same store directory, so everything
// JetStream acknowledged is there again. It returns once every open
// connection from Conn has reconnected to the new server.
//
// The wait matters: an embedded restart takes about a millisecond, less
// than a client needs to read the EOF, so without it the next request goes
// out on the dead socket and is lost, and the caller waits for a reply that
// never comes.
func (n *NATSServer) Restart(tb testing.TB) {
	tb.Helper()
	n.mu.Lock()
	conns := slices.DeleteFunc(slices.Clone(n.conns), (*nats.Conn).IsClosed)
	n.mu.Unlock()
	// Listen before the shutdown so no status change is missed. A
	// connection reports CONNECTED again only after a reconnect.
	watches := make([]chan nats.Status, len(conns))
	for i, nc := range conns {
		watches[i] = nc.StatusChanged(nats.CONNECTED, nats.CLOSED)
		defer nc.RemoveStatusListener(watches[i])
	}
	n.Shutdown()
	if err := n.start(); err != nil {
		tb.Fatalf("testenv: restarting: %v", err)
	}
	timeout := time.After(30 * time.Second)
	for i, nc := range conns {
		select {
		case <-watches[i]: // CONNECTED, or CLOSED by its owner
		case <-timeout:
			tb.Fatalf("testenv: connection %q did not reconnect to the restarted server in 30s (status %v)", nc.Opts.Name, nc.Status())
		}
	}
}

// Shutdown stops the server and waits until it has stopped. It is
// idempotent; the test's cleanup calls it too.
func (n *NATSServer) Shutdown() {
	n.mu.Lock()
	srv := n.srv
	n.srv = nil
	n.mu.Unlock()
	if srv != nil {
		srv.Shutdown()
		srv.WaitForShutdown()
	}
}

// connect opens a client connection that never gives up reconnecting.
func connect(tb testing.TB, url string, opts []nats.Option) *nats.Conn {
	tb.Helper()
	all := append([]nats.Option{
		nats.Name(tb.Name()),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(25 * time.Millisecond),
		nats.ReconnectJitter(0, 0),
	}, opts...)
	nc, err := nats.Connect(url, all...)
	if err != nil {
		tb.Fatalf("testenv: connecting to %s: %v", url, err)
	}
	tb.Cleanup(nc.Close)
	return nc
}

// tbLogger writes the embedded server's log to the test log.
type tbLogger struct{ tb testing.TB }

func (l tbLogger) Noticef(format string, v ...any) { l.tb.Logf("nats: "+format, v...) }
func (l tbLogger) Warnf(format string, v ...any)   { l.tb.Logf("nats: [WRN] "+format, v...) }
func (l tbLogger) Fatalf(format string, v ...any)  { l.tb.Logf("nats: [FTL] "+format, v...) }
func (l tbLogger) Errorf(format string, v ...any)  { l.tb.Logf("nats: [ERR] "+format, v...) }
func (l tbLogger) Debugf(format string, v ...any)  { l.tb.Logf("nats: [DBG] "+format, v...) }
func (l tbLogger) Tracef(format string, v ...any)  { l.tb.Logf("nats: [TRC] "+format, v...) }
