package palcli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/palrun/pal/eventstore/natsauth"
	"github.com/palrun/pal/internal/natsraft"
)

// natsNodeCmd is the hidden `pal dev-nats-node`: one node of pal dev
// --cluster's JetStream cluster, the embedded server in a process of its
// own, so it can be killed like any nats-server.
func (e *env) natsNodeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:    "dev-nats-node --name N --listen HOST:PORT --cluster HOST:PORT --routes URL,… --store DIR --data-dir DIR",
		Short:  "One node of pal dev --cluster (started by pal dev)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE:   e.runNATSNode,
	}
	f := cmd.Flags()
	f.String("name", "", "server name")
	f.String("listen", "", "client address")
	f.String("cluster", "", "route address")
	f.String("routes", "", "every node's route URL, comma-separated")
	f.String("store", "", "JetStream store directory")
	f.String("data-dir", "", "pal dev's data directory (the role seeds)")
	f.Bool("sync-always", false, "fsync before every acknowledgement")
	return cmd
}

func (e *env) runNATSNode(cmd *cobra.Command, _ []string) error {
	f := cmd.Flags()
	name, _ := f.GetString("name")
	listen, _ := f.GetString("listen")
	cluster, _ := f.GetString("cluster")
	routes, _ := f.GetString("routes")
	store, _ := f.GetString("store")
	dataDir, _ := f.GetString("data-dir")
	syncAlways, _ := f.GetBool("sync-always")
	host, port, err := splitHostPort(listen)
	if err != nil {
		return badInput("--listen: %v", err)
	}
	chost, cport, err := splitHostPort(cluster)
	if err != nil {
		return badInput("--cluster: %v", err)
	}
	// pal dev's environment names the same client users (PAL_NATS_USERS).
	users, err := natsauth.ParseUsers(e.getenv(natsauth.EnvUsers))
	if err != nil {
		return badInput("%v", err)
	}
	keys, users, err := devUsers(dataDir, users)
	if err != nil {
		return err
	}
	var routeURLs []*url.URL
	for _, r := range strings.Split(routes, ",") {
		u, err := url.Parse(r)
		if err != nil {
			return badInput("--routes: %v", err)
		}
		routeURLs = append(routeURLs, u)
	}
	// A killed leader is replaced in about a second, not stock
	// nats-server's 4–9 s (natsraft).
	if err := natsraft.Set(natsraft.Fast); err != nil {
		return err
	}
	opts, err := keys.ServerOptions(users)
	if err != nil {
		return badInput("configuring NATS node %s: %v", name, err)
	}
	opts.ServerName, opts.JetStream, opts.StoreDir, opts.Host, opts.Port, opts.NoSigs = name, true, store, host, port, true
	opts.SyncAlways, opts.Routes = syncAlways, routeURLs
	opts.Cluster = server.ClusterOpts{Name: "pal-dev", Host: chost, Port: cport}
	srv, err := server.NewServer(opts)
	if err != nil {
		return badInput("configuring NATS node %s: %v", name, err)
	}
	srv.SetLoggerV2(newNATSLogger(e.stderr, name), false, false, false)
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		return withCode(ExitUnavailable, fmt.Errorf("NATS node %s could not listen on %s", name, listen))
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	<-ctx.Done()
	srv.Shutdown()
	srv.WaitForShutdown()
	return nil
}

// devCluster is pal dev --cluster's processes: N NATS nodes and the
// workers, each a child of pal dev that dies with it.
type devCluster struct {
	bin     string
	dataDir string
	log     *slog.Logger
	urls    []string

	mu       sync.Mutex
	nodes    []*devChild
	workers  []*devChild
	stopping bool
	wg       sync.WaitGroup
}

// devChild is one child process and how to start it again.
type devChild struct {
	name string
	args []string
	env  []string
	cmd  *exec.Cmd
	done chan struct{}
}

// startDevCluster starts n NATS nodes as child processes of pal dev, their
// client ports from port on (port, port+1, …), routes on free ports, stores
// under dataDir/nats-<i>. A node that exits while pal dev runs (kill -9 it
// to watch a failover) is started again after 2 s, on the same ports and
// store. It returns once every node accepts connections.
func startDevCluster(ctx context.Context, n int, dataDir, host string, port int, syncAlways bool, log *slog.Logger) (*devCluster, error) {
	bin, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("finding the pal binary: %w", err)
	}
	c := &devCluster{bin: bin, dataDir: dataDir, log: log}
	routes := make([]string, n)
	for i := range n {
		p, err := freeLoopbackPort()
		if err != nil {
			return nil, err
		}
		routes[i] = fmt.Sprintf("nats://127.0.0.1:%d", p)
	}
	for i := range n {
		name := fmt.Sprintf("node%d", i+1)
		listen := net.JoinHostPort(host, strconv.Itoa(port+i))
		args := []string{"dev-nats-node", "--name", name, "--listen", listen, "--cluster", strings.TrimPrefix(routes[i], "nats://"),
			"--routes", strings.Join(routes, ","), "--store", filepath.Join(dataDir, "nats-"+strconv.Itoa(i+1)), "--data-dir", dataDir}
		if syncAlways {
			args = append(args, "--sync-always")
		}
		c.nodes = append(c.nodes, &devChild{name: name, args: args})
		c.urls = append(c.urls, "nats://"+listen)
	}
	for _, node := range c.nodes {
		if err := c.start(node, true); err != nil {
			c.stop()
			return nil, err
		}
	}
	for i, u := range c.urls {
		if err := waitListening(ctx, strings.TrimPrefix(u, "nats://"), 15*time.Second); err != nil {
			c.stop()
			return nil, fmt.Errorf("NATS node %s on %s: %w", c.nodes[i].name, u, err)
		}
	}
	return c, nil
}

// URL is the cluster's client URLs, comma-separated.
func (c *devCluster) URL() string { return strings.Join(c.urls, ",") }

// startWorker starts `pal worker` as a child with env added to pal dev's
// environment.
func (c *devCluster) startWorker(id string, env []string) error {
	w := &devChild{name: id, args: []string{"worker", "--worker-id", id}, env: env}
	c.mu.Lock()
	c.workers = append(c.workers, w)
	c.mu.Unlock()
	return c.start(w, false)
}

// start runs child; a node (restart) is started again when it exits
// while pal dev runs.
func (c *devCluster) start(child *devChild, restart bool) error {
	cmd := exec.Command(c.bin, child.args...)
	cmd.Env = append(os.Environ(), child.env...)
	logf, err := os.OpenFile(filepath.Join(c.dataDir, child.name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = childProcAttr()
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("starting %s: %w", child.name, err)
	}
	c.mu.Lock()
	child.cmd, child.done = cmd, make(chan struct{})
	c.mu.Unlock()
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		err := cmd.Wait()
		logf.Close()
		close(child.done)
		c.mu.Lock()
		stopping := c.stopping
		c.mu.Unlock()
		if stopping {
			return
		}
		if !restart {
			c.log.Warn("worker exited; start another with pal worker in this directory", "worker", child.name, "pid", cmd.Process.Pid, "err", err)
			return
		}
		c.log.Warn("NATS node exited; starting it again in 2s", "node", child.name, "pid", cmd.Process.Pid, "err", err)
		time.Sleep(2 * time.Second)
		c.mu.Lock()
		stopping = c.stopping
		c.mu.Unlock()
		if stopping {
			return
		}
		if err := c.start(child, true); err != nil {
			c.log.Error("starting the NATS node again", "node", child.name, "err", err)
			return
		}
		c.log.Info("NATS node started again", "node", child.name, "pid", child.cmd.Process.Pid)
	}()
	return nil
}

// pids lists the children's names and pids, for the banner.
func (c *devCluster) pids(children []*devChild) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	parts := make([]string, 0, len(children))
	for _, ch := range children {
		parts = append(parts, fmt.Sprintf("%s pid %d", ch.name, ch.cmd.Process.Pid))
	}
	return strings.Join(parts, ", ")
}

// stop ends the workers, then the nodes (SIGTERM, SIGKILL after 10 s).
func (c *devCluster) stop() {
	c.mu.Lock()
	c.stopping = true
	groups := [][]*devChild{c.workers, c.nodes}
	c.mu.Unlock()
	for _, group := range groups {
		for _, ch := range group {
			if ch.cmd != nil && ch.cmd.Process != nil {
				_ = ch.cmd.Process.Signal(syscall.SIGTERM)
			}
		}
		for _, ch := range group {
			if ch.done == nil {
				continue
			}
			select {
			case <-ch.done:
			case <-time.After(10 * time.Second):
				_ = ch.cmd.Process.Kill()
				<-ch.done
			}
		}
	}
	c.wg.Wait()
}

// connect connects to the cluster as role, reconnecting to another node
// when one goes.
func (c *devCluster) connect(keys *natsauth.Keys, role natsauth.Role, log *slog.Logger) (*nats.Conn, error) {
	nc, err := nats.Connect(c.URL(), nats.Name("pal-dev-"+string(role)), keys.Option(role),
		nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond), nats.RetryOnFailedConnect(true),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			log.Error("NATS error", "role", role, "err", err)
		}))
	if err != nil {
		return nil, fmt.Errorf("connecting to the NATS cluster as %s: %w", role, err)
	}
	return nc, nil
}

func waitListening(ctx context.Context, addr string, within time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	var d net.Dialer
	for {
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			return conn.Close()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not listening: %w", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func freeLoopbackPort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func splitHostPort(s string) (string, int, error) {
	h, p, err := net.SplitHostPort(s)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		return "", 0, errors.New("bad port")
	}
	return h, port, nil
}

// natsLogger writes the node's notices and warnings to w, prefixed with
// its name.
type natsLogger struct {
	w    io.Writer
	name string
}

func newNATSLogger(w io.Writer, name string) *natsLogger { return &natsLogger{w: w, name: name} }

func (l *natsLogger) logf(level, format string, v ...any) {
	fmt.Fprintf(l.w, "%s %s [%s] %s\n", time.Now().Format(time.RFC3339Nano), l.name, level, fmt.Sprintf(format, v...))
}
func (l *natsLogger) Noticef(format string, v ...any) { l.logf("INF", format, v...) }
func (l *natsLogger) Warnf(format string, v ...any)   { l.logf("WRN", format, v...) }
func (l *natsLogger) Fatalf(format string, v ...any)  { l.logf("FTL", format, v...) }
func (l *natsLogger) Errorf(format string, v ...any)  { l.logf("ERR", format, v...) }
func (l *natsLogger) Debugf(string, ...any)           {}
func (l *natsLogger) Tracef(string, ...any)           {}
