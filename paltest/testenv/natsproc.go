package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// NATSProc is a nats-server running as a separate process, for tests that
// kill -9 the broker. It keeps its port and store directory across Kill and
// Start.
type NATSProc struct {
	bin  string
	args []string
	url  string

	mu   sync.Mutex
	proc *Process
}

// strictNATSConfig is the configuration file Strict adds: fsync before
// every acknowledgement.
const strictNATSConfig = "jetstream {\n  sync_interval: always\n}\n"

// natsProcReady bounds how long NATSProcess and Start wait for the server.
const natsProcReady = 30 * time.Second

// NATSProcess starts nats-server (built from the version in go.mod, see
// BuildBinary) as a child process with JetStream, its store in a fresh
// t.TempDir(), listening on 127.0.0.1 on a free port (or Port's). It returns
// once the server accepts connections and JetStream answers. Strict adds
// `jetstream { sync_interval: always }`. The test's cleanup kills it.
func NATSProcess(tb testing.TB, opts ...NATSOption) *NATSProc {
	tb.Helper()
	cfg := newNATSConfig(opts)
	if cfg.roles {
		tb.Fatalf("testenv: NATSProcess does not take Roles; use NATS")
	}
	bin := natsServerBinary(tb)
	dir := tb.TempDir()
	storeDir := filepath.Join(dir, "store")
	args := []string{"-js", "-sd", storeDir, "-a", "127.0.0.1", "-n", "pal-test"}
	if cfg.strict {
		conf := filepath.Join(dir, "nats.conf")
		if err := os.WriteFile(conf, []byte(strictNATSConfig), 0o644); err != nil {
			tb.Fatalf("testenv: writing %s: %v", conf, err)
		}
		args = append(args, "-c", conf)
	}
	n := &NATSProc{bin: bin}
	// Another process may take the free port before the server binds it.
	for attempt := 1; ; attempt++ {
		port := cfg.port
		if port == 0 {
			port = FreePort(tb)
		}
		n.args = append(args[:len(args):len(args)], "-p", strconv.Itoa(port))
		n.url = "nats://127.0.0.1:" + strconv.Itoa(port)
		err := n.launch(tb)
		if err == nil {
			return n
		}
		if cfg.port != 0 || attempt == 3 {
			tb.Fatalf("testenv: %v", err)
		}
	}
}

// URL returns the client URL, nats://127.0.0.1:<port>.
func (n *NATSProc) URL() string { return n.url }

// Conn connects to the server like NATSServer.Conn: reconnecting forever
// every 25ms, closed by the test's cleanup.
func (n *NATSProc) Conn(tb testing.TB, opts ...nats.Option) *nats.Conn {
	tb.Helper()
	return connect(tb, n.url, opts)
}

// Process returns the running server process (nil after Kill or Stop), for
// SIGSTOP/SIGCONT and its output.
func (n *NATSProc) Process() *Process {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.proc
}

// Start starts the server again on the same port with the same store
// directory and waits until JetStream answers. The process belongs to tb:
// its cleanup kills it, and its output is logged if tb fails.
func (n *NATSProc) Start(tb testing.TB) {
	tb.Helper()
	n.mu.Lock()
	if n.proc != nil {
		select {
		case <-n.proc.Exited():
		default:
			n.mu.Unlock()
			tb.Fatalf("testenv: nats-server on %s is already running (pid %d)", n.url, n.proc.PID())
		}
	}
	n.mu.Unlock()
	if err := n.launch(tb); err != nil {
		tb.Fatalf("testenv: %v", err)
	}
}

// launch starts the server process and waits until JetStream answers; if
// it does not, launch kills the process and returns why.
func (n *NATSProc) launch(tb testing.TB) error {
	tb.Helper()
	p := StartProcess(tb, n.bin, n.args, nil)
	ctx, cancel := context.WithTimeout(context.Background(), natsProcReady)
	defer cancel()
	if err := waitJetStream(ctx, n.url, p); err != nil {
		p.Kill()
		return fmt.Errorf("nats-server on %s: %w\noutput:\n%s", n.url, err, tail(p.Output(), 4000))
	}
	n.mu.Lock()
	n.proc = p
	n.mu.Unlock()
	return nil
}

// Kill kills the server with SIGKILL and waits until it is gone.
func (n *NATSProc) Kill() {
	if p := n.take(); p != nil {
		p.Kill()
	}
}

// Stop shuts the server down cleanly (SIGTERM) and waits until it has
// exited, killing it if it takes longer than 30s.
func (n *NATSProc) Stop() {
	p := n.take()
	if p == nil {
		return
	}
	if err := p.Term(); err != nil {
		return // already exited
	}
	if !p.waitExit(30 * time.Second) {
		p.Kill()
	}
}

func (n *NATSProc) take() *Process {
	n.mu.Lock()
	defer n.mu.Unlock()
	p := n.proc
	n.proc = nil
	return p
}

// waitJetStream polls until a client can connect to url and JetStream
// answers an account-info request, or p exits, or ctx ends.
func waitJetStream(ctx context.Context, url string, p *Process) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		last = jetStreamAnswers(ctx, url)
		if last == nil {
			return nil
		}
		select {
		case <-tick.C:
		case <-p.Exited():
			return fmt.Errorf("exited before it was ready (%s)", p.exitState())
		case <-ctx.Done():
			return fmt.Errorf("not ready: %w (last error: %v)", ctx.Err(), last)
		}
	}
}

func jetStreamAnswers(ctx context.Context, url string) error {
	nc, err := nats.Connect(url, nats.Timeout(time.Second), nats.NoReconnect())
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := js.AccountInfo(ctx); err != nil {
		return errors.Join(errors.New("JetStream does not answer"), err)
	}
	return nil
}
