package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/palrun/pal/internal/retry"
)

// Options configure a cluster started by Start.
type Options struct {
	// DataDir is the data directory, made by Init. Required.
	DataDir string
	// Port is the TCP port on 127.0.0.1. Zero picks a free port at the
	// first start; the cluster keeps it for later starts.
	Port int
	// SocketDir is where the server makes its Unix socket (created if
	// missing, owned by the server's user). Empty: no Unix socket, TCP on
	// 127.0.0.1 only.
	SocketDir string
	// Fsync makes the server sync to disk (fsync and full_page_writes on),
	// so that committed data survives a crash of the machine. Off, it never
	// waits for the disk: for throwaway clusters. synchronous_commit stays
	// on either way, so a server that crashes or is stopped with
	// StopImmediate keeps every transaction it acknowledged.
	Fsync bool
	// LogFile receives the server's log, appended to (created if missing,
	// owned by the server's user). Empty: postgres.log in DataDir.
	LogFile string
	// MaxConnections sets max_connections; zero keeps PostgreSQL's default
	// (100).
	MaxConnections int
	// BinDir is where initdb, pg_ctl and postgres are. Empty: BinDir().
	BinDir string
}

// StopMode is how Stop shuts the server down (pg_ctl stop -m).
type StopMode string

const (
	// StopSmart waits for every client to disconnect, then shuts down
	// cleanly.
	StopSmart StopMode = "smart"
	// StopFast rolls back open transactions, disconnects the clients and
	// shuts down cleanly with a checkpoint: the next start needs no
	// recovery.
	StopFast StopMode = "fast"
	// StopImmediate kills the server without a checkpoint, as a crash
	// would; the next start replays the WAL. With Fsync off the data
	// survives this, but not a crash of the machine.
	StopImmediate StopMode = "immediate"
)

// ErrPortInUse means another program listens on the cluster's port. Start
// returns it as a *PortInUseError.
var ErrPortInUse = errors.New("port in use")

// PortInUseError says which port on 127.0.0.1 was taken.
type PortInUseError struct {
	Port int
}

func (e *PortInUseError) Error() string {
	return fmt.Sprintf("PostgreSQL cannot listen on 127.0.0.1:%d: another program uses that port; "+
		"stop it or choose another port", e.Port)
}

// Is makes errors.Is(err, ErrPortInUse) true.
func (e *PortInUseError) Is(target error) bool { return target == ErrPortInUse }

// ErrRunning means a server already runs in the data directory. Start
// returns it as a *RunningError.
var ErrRunning = errors.New("PostgreSQL already runs in the data directory")

// RunningError describes the server that already runs in a data directory.
type RunningError struct {
	DataDir string
	PID     int
	Port    int
}

func (e *RunningError) Error() string {
	return fmt.Sprintf("a PostgreSQL server (pid %d, port %d) already runs in %s: "+
		"use it, or stop it first (pg_ctl stop -D %s)", e.PID, e.Port, e.DataDir, e.DataDir)
}

// Is makes errors.Is(err, ErrRunning) true.
func (e *RunningError) Is(target error) bool { return target == ErrRunning }

// errShmemInUse is a start that failed because processes of a server that
// died still hold its shared memory; they exit soon after their postmaster.
var errShmemInUse = errors.New("the shared memory of a previous server is still in use")

// defaultWait bounds a start or stop whose context has no deadline.
const defaultWait = 5 * time.Minute

// shmemWait bounds how long Start waits for the processes of a dead server to
// exit when its context has no deadline.
const shmemWait = 30 * time.Second

// Cluster is a PostgreSQL server on 127.0.0.1 over a data directory, started
// with pg_ctl. Its methods may be called from any goroutine.
type Cluster struct {
	binDir    string
	dataDir   string
	socketDir string
	logFile   string
	fsync     bool
	maxConns  int
	user      serverUser

	mu        sync.Mutex
	password  string // the postgres password; "" for a cluster made with trust
	port      int
	portFixed bool // given, or kept since the first start
	running   bool
}

// Start starts a server over opts.DataDir, which Init must have made, and
// returns once it accepts connections on 127.0.0.1.
//
// A postmaster.pid left behind by a server that died (killed with SIGKILL,
// or the machine crashed) is removed first; if processes of that server
// still hold its shared memory, Start waits for them to exit. Errors:
// *PortInUseError (ErrPortInUse) when another program has the port;
// *RunningError (ErrRunning) when a server already runs in the data
// directory; an error quoting the server's log when it does not come up; ctx's
// error when ctx ends first.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	c, err := newCluster(opts)
	if err != nil {
		return nil, err
	}
	if err := c.Start(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

func newCluster(opts Options) (*Cluster, error) {
	if opts.DataDir == "" {
		return nil, errors.New("starting PostgreSQL: no data directory given")
	}
	if opts.Port < 0 || opts.Port > math.MaxUint16 {
		return nil, fmt.Errorf("starting PostgreSQL: port %d is out of range", opts.Port)
	}
	binDir, err := binDirOr(opts.BinDir)
	if err != nil {
		return nil, err
	}
	u, err := currentServerUser()
	if err != nil {
		return nil, err
	}
	c := &Cluster{
		binDir:    binDir,
		fsync:     opts.Fsync,
		maxConns:  opts.MaxConnections,
		user:      u,
		port:      opts.Port,
		portFixed: opts.Port != 0,
	}
	if c.dataDir, err = filepath.Abs(opts.DataDir); err != nil {
		return nil, fmt.Errorf("starting PostgreSQL: %w", err)
	}
	if opts.SocketDir != "" {
		if c.socketDir, err = filepath.Abs(opts.SocketDir); err != nil {
			return nil, fmt.Errorf("starting PostgreSQL: %w", err)
		}
	}
	if c.password, err = readPassword(c.dataDir); err != nil {
		return nil, fmt.Errorf("starting PostgreSQL: %w", err)
	}
	c.logFile = filepath.Join(c.dataDir, "postgres.log")
	if opts.LogFile != "" {
		if c.logFile, err = filepath.Abs(opts.LogFile); err != nil {
			return nil, fmt.Errorf("starting PostgreSQL: %w", err)
		}
	}
	// pg_ctl hands these paths to a shell inside double or single quotes.
	for what, p := range map[string]string{"data directory": c.dataDir, "socket directory": c.socketDir, "log file": c.logFile} {
		if i := strings.IndexAny(p, "\"'`$\\\n"); i >= 0 {
			return nil, fmt.Errorf("starting PostgreSQL: the %s %q holds %q, which pg_ctl cannot pass on; "+
				"choose a path without quotes, $, ` or \\", what, p, p[i])
		}
	}
	return c, nil
}

// DSN returns the URL of database db on the cluster, as the postgres
// superuser with its password (from PasswordFile) over TCP on 127.0.0.1,
// without TLS.
func (c *Cluster) DSN(db string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dsn(db)
}

// dsn is DSN with c.mu held.
func (c *Cluster) dsn(db string) string {
	user := url.User("postgres")
	if c.password != "" {
		user = url.UserPassword("postgres", c.password)
	}
	u := url.URL{
		Scheme:   "postgres",
		User:     user,
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(c.port)),
		Path:     "/" + db,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// Port returns the server's TCP port on 127.0.0.1 (0 before a cluster
// started with Port 0 has started).
func (c *Cluster) Port() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.port
}

// DataDir returns the absolute path of the data directory.
func (c *Cluster) DataDir() string { return c.dataDir }

// LogFile returns the absolute path of the server's log file.
func (c *Cluster) LogFile() string { return c.logFile }

// Running reports whether the server was started and not stopped since. A
// server that died under the cluster still counts as running until Stop.
func (c *Cluster) Running() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.running
}

// PID returns the process id of the server's postmaster, or 0 if none runs
// in the data directory.
func (c *Cluster) PID() int {
	state, pf, err := inspectServer(c.dataDir)
	if err != nil || state != stateRunning {
		return 0
	}
	return pf.pid
}

// Start starts the server again after Stop, on the same port and with the
// same options, and returns once it accepts connections. Starting a running
// cluster does nothing; one whose server died under it (killed, say) is
// started again. It returns the errors the function Start does.
func (c *Cluster) Start(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.running {
		if state, _, err := inspectServer(c.dataDir); err == nil && state == stateRunning {
			return nil
		}
		c.running = false // it died under us
	}
	if err := c.start(ctx); err != nil {
		return fmt.Errorf("starting PostgreSQL in %s: %w", c.dataDir, err)
	}
	c.running, c.portFixed = true, true
	return nil
}

func (c *Cluster) start(ctx context.Context) error {
	if !initialised(c.dataDir) {
		return errors.New("not a PostgreSQL data directory (no PG_VERSION); Init makes one")
	}
	if err := c.user.canEnter(ctx, c.binDir, c.dataDir); err != nil {
		return err
	}
	if err := c.prepareFiles(); err != nil {
		return err
	}
	if err := c.clearStale(); err != nil {
		return err
	}
	shmemDeadline := time.Now().Add(shmemWait)
	if d, ok := ctx.Deadline(); ok {
		shmemDeadline = d
	}
	for attempt := 1; ; attempt++ {
		if c.port == 0 {
			port, err := freePort()
			if err != nil {
				return fmt.Errorf("finding a free port: %w", err)
			}
			c.port = port
		}
		err := c.startWaitingForShmem(ctx, shmemDeadline)
		if errors.Is(err, ErrPortInUse) && !c.portFixed && attempt < 3 {
			// The free port was taken before the server bound it.
			c.port = 0
			continue
		}
		return err
	}
}

// shmemRetry paces the starts that wait for the processes of a server that
// died to exit.
var shmemRetry = retry.Policy{Initial: 10 * time.Millisecond, Max: 200 * time.Millisecond}

// startWaitingForShmem starts the server, trying again while the shared
// memory of a server that died is still in use, until deadline.
func (c *Cluster) startWaitingForShmem(ctx context.Context, deadline time.Time) error {
	var last error
	err := retry.Do(ctx, shmemRetry, func() error {
		last = c.startOnce(ctx)
		// Try again only if the longest wait still ends before deadline.
		if errors.Is(last, errShmemInUse) && time.Now().Add(shmemRetry.Max).Before(deadline) {
			return last
		}
		return retry.Permanent(last)
	})
	if err != nil && ctx.Err() == nil {
		return last // the deadline passed while waiting
	}
	return err
}

// prepareFiles creates the log file and the socket directory for the
// server's user.
func (c *Cluster) prepareFiles() error {
	if c.socketDir != "" {
		if err := os.MkdirAll(c.socketDir, 0o700); err != nil {
			return fmt.Errorf("creating the socket directory: %w", err)
		}
		if err := c.user.chown(c.socketDir); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(filepath.Dir(c.logFile), 0o755); err != nil {
		return fmt.Errorf("creating the directory of the log file: %w", err)
	}
	f, err := os.OpenFile(c.logFile, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("creating the log file: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("creating the log file: %w", err)
	}
	return c.user.chown(c.logFile)
}

// clearStale removes the postmaster.pid of a server that is gone, or fails
// with a *RunningError if one runs.
func (c *Cluster) clearStale() error {
	state, pf, err := inspectServer(c.dataDir)
	switch {
	case err != nil:
		return err
	case state == stateRunning:
		return &RunningError{DataDir: c.dataDir, PID: pf.pid, Port: pf.port}
	case state == stateStale:
		return removeStale(c.dataDir, pf)
	}
	return nil
}

// startOnce runs pg_ctl start once and waits until the server accepts
// connections.
func (c *Cluster) startOnce(ctx context.Context) error {
	if err := checkPort(c.port); err != nil {
		return err
	}
	logStart := fileSize(c.logFile)
	opts := []string{
		"-p " + strconv.Itoa(c.port),
		"-c listen_addresses=127.0.0.1",
		"-k '" + c.socketDir + "'", // '' makes no Unix socket
	}
	if !c.fsync {
		opts = append(opts, "-c fsync=off", "-c full_page_writes=off")
	}
	if c.maxConns > 0 {
		opts = append(opts, "-c max_connections="+strconv.Itoa(c.maxConns))
	}
	// pg_ctl -w polls the server's pid file until the server is ready, or
	// until its child, the postmaster, exits.
	err := c.user.run(ctx, c.binDir, c.dataDir, "pg_ctl", "-D", c.dataDir, "-l", c.logFile,
		"-o", strings.Join(opts, " "), "-w", "-t", waitSeconds(ctx), "start")
	if err == nil {
		err = c.waitReady(ctx)
	}
	if err == nil {
		return nil
	}
	log := readFrom(c.logFile, logStart)
	switch {
	case strings.Contains(log, "Address already in use"):
		return &PortInUseError{Port: c.port}
	case strings.Contains(log, "pre-existing shared memory block"):
		return fmt.Errorf("%w: %w", errShmemInUse, err)
	}
	// pg_ctl may have given up (ctx ended) on a server that comes up later.
	if state, _, _ := inspectServer(c.dataDir); state == stateRunning {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		_ = c.user.run(stopCtx, c.binDir, c.dataDir, "pg_ctl", "-D", c.dataDir, "-m", string(StopImmediate), "-w", "stop")
	}
	return fmt.Errorf("%w\nserver log (%s):\n%s", err, c.logFile, tail(log, 4000))
}

// waitReady polls until the server accepts a connection on 127.0.0.1. It
// fails if the server refuses the password, its postmaster goes away or ctx
// ends first. c.mu is held.
func (c *Cluster) waitReady(ctx context.Context) error {
	dsn := c.dsn("postgres") + "&connect_timeout=5"
	return retry.Do(ctx, readyRetry, func() error {
		conn, err := pgx.Connect(ctx, dsn)
		if err == nil {
			return retry.Permanent(conn.Close(ctx))
		}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && (pgErr.Code == "28P01" || pgErr.Code == "28000") {
			// invalid_password, invalid_authorization_specification
			return retry.Permanent(fmt.Errorf("the server refuses the postgres login (password in %s): %w",
				filepath.Join(c.dataDir, PasswordFile), err))
		}
		if state, _, _ := inspectServer(c.dataDir); state != stateRunning {
			return retry.Permanent(fmt.Errorf("the server went away before accepting connections: %w", err))
		}
		return fmt.Errorf("waiting for PostgreSQL on port %d: %w", c.port, err)
	})
}

// readyRetry paces the connection attempts of waitReady.
var readyRetry = retry.Policy{Initial: 5 * time.Millisecond, Max: 100 * time.Millisecond}

// Stop shuts the server down in mode and waits until it has exited. Stopping
// a cluster that is not running does nothing, and so does stopping one whose
// server died under it. StopFast leaves the data directory clean for the
// next start. Give Stop a context that is still live when the caller's own
// is cancelled (context.WithoutCancel with a timeout); pg_ctl is killed when
// ctx ends.
func (c *Cluster) Stop(ctx context.Context, mode StopMode) error {
	switch mode {
	case StopSmart, StopFast, StopImmediate:
	default:
		return fmt.Errorf("stopping PostgreSQL: unknown stop mode %q (want smart, fast or immediate)", mode)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.running {
		return nil
	}
	if state, _, err := inspectServer(c.dataDir); err == nil && state != stateRunning {
		c.running = false
		return nil
	}
	err := c.user.run(ctx, c.binDir, c.dataDir, "pg_ctl", "-D", c.dataDir, "-m", string(mode),
		"-w", "-t", waitSeconds(ctx), "stop")
	if err != nil {
		if state, _, ierr := inspectServer(c.dataDir); ierr == nil && state != stateRunning {
			c.running = false
			return nil
		}
		return fmt.Errorf("stopping PostgreSQL in %s: %w", c.dataDir, err)
	}
	c.running = false
	return nil
}

// checkPort returns a *PortInUseError if port on 127.0.0.1 is taken.
func checkPort(port int) error {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return &PortInUseError{Port: port}
		}
		return fmt.Errorf("checking that port %d on 127.0.0.1 is free: %w", port, err)
	}
	return l.Close()
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitSeconds is pg_ctl's -t for ctx: the seconds left until its deadline,
// rounded up.
func waitSeconds(ctx context.Context) string {
	d := defaultWait
	if deadline, ok := ctx.Deadline(); ok {
		d = time.Until(deadline)
	}
	return strconv.Itoa(max(1, int(math.Ceil(d.Seconds()))))
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// readFrom returns what path holds from offset on.
func readFrom(path string, offset int64) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	return string(b)
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}
