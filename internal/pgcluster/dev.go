package pgcluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DevPort is the port Dev's server listens on when it is free: 5433, next to
// PostgreSQL's own 5432, so that a PostgreSQL the machine already runs keeps
// its port and PAL's dev database has a stable address.
const DevPort = 5433

// DevDatabase is the database Dev creates for PAL.
const DevDatabase = "pal"

// Dev runs the local PostgreSQL of `pal dev`: a durable cluster (fsync on)
// in dataDir (e.g. ./.pal/pg), initialised on first use, listening on
// 127.0.0.1:DevPort, or on a free port (logged) when another program has
// DevPort, without a Unix socket, with database DevDatabase created if
// missing. Its DSN is c.DSN(DevDatabase), which carries the postgres
// password from PasswordFile in the data directory: the same password for
// every run over the same data. Stop it with StopFast when pal dev exits:
// the data directory is then clean for the next run.
//
// A cluster made before PAL set passwords (trust authentication) gets a
// password and PAL's pg_hba.conf, and is restarted, before Dev returns.
//
// A server left running in the data directory by an earlier pal dev that was
// killed is used as it is (logged); Stop stops it as if Dev had started it.
// One that was killed itself leaves a stale postmaster.pid, which Start
// clears.
//
// When PAL runs as root, the server runs as user postgres (else nobody) and
// its data directory belongs to that user. That user must be able to reach
// dataDir: Dev creates dataDir's missing parents with mode 0755 (whatever
// the umask) and leaves them to the current user, but changes no permission
// on directories it did not create. If some parent is closed to
// it (a checkout under /root, say), the data goes to
// <postgres's home>/pal-dev/<key>/pg instead (/var/lib/postgresql on Debian
// and Ubuntu; os.TempDir() if the home directory is out of reach too), where
// <key> is derived from dataDir's absolute path so that every run from the
// same checkout finds the same data; a file named source next to pg records
// that path, and Dev logs where the data is. A cluster already in dataDir or
// in that place is used wherever it is.
//
// log may be nil. Errors: ErrNotInstalled without PostgreSQL binaries, and
// the errors of Init and Start.
func Dev(ctx context.Context, dataDir string, log *slog.Logger) (*Cluster, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	begin := time.Now()
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		return nil, fmt.Errorf("starting the dev PostgreSQL: %w", err)
	}
	binDir, err := BinDir()
	if err != nil {
		return nil, err
	}
	u, err := currentServerUser()
	if err != nil {
		return nil, err
	}
	dir, err := devDataDir(ctx, binDir, u, abs, log)
	if err != nil {
		return nil, err
	}
	fresh := !initialised(dir)
	if err := Init(ctx, dir, WithBinDir(binDir)); err != nil {
		return nil, err
	}
	if fresh {
		log.Info("initialised a PostgreSQL data directory", "data", dir, "took", time.Since(begin).Round(time.Millisecond))
	}

	opts := Options{DataDir: dir, Port: DevPort, Fsync: true, BinDir: binDir}
	c, err := Start(ctx, opts)
	var running *RunningError
	switch {
	case errors.Is(err, ErrPortInUse):
		opts.Port = 0
		c, err = Start(ctx, opts)
		if err == nil {
			log.Warn("the PostgreSQL dev port is taken, so PostgreSQL listens on a free port",
				"want", DevPort, "port", c.Port())
		}
	case errors.As(err, &running):
		c, err = attach(ctx, opts)
		if err == nil {
			log.Info("PostgreSQL from an earlier pal dev still runs; using it", "pid", running.PID, "port", c.Port())
		}
	}
	if err != nil {
		return nil, err
	}
	if err := c.devReady(ctx, log); err != nil {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		_ = c.Stop(stopCtx, StopFast)
		return nil, err
	}
	// The log gets the address, not the password.
	dsn, _ := url.Parse(c.DSN(DevDatabase))
	log.Info("PostgreSQL ready", "dsn", dsn.Redacted(), "data", dir, "log", c.LogFile(),
		"took", time.Since(begin).Round(time.Millisecond))
	return c, nil
}

// devReady secures a cluster from before PAL set passwords and creates
// DevDatabase.
func (c *Cluster) devReady(ctx context.Context, log *slog.Logger) error {
	c.mu.Lock()
	trusted := c.password == ""
	c.mu.Unlock()
	if trusted {
		log.Warn("the dev PostgreSQL let any local user in (trust authentication); setting a password and restarting it",
			"password_file", filepath.Join(c.dataDir, PasswordFile))
		err := c.secure(ctx)
		if errors.Is(err, ErrPortInUse) {
			// Another program took the port while the server restarted
			// (another pal dev, a test): as at the first start, PostgreSQL
			// listens on a free port.
			c.mu.Lock()
			want := c.port
			c.port, c.portFixed = 0, false
			c.mu.Unlock()
			if err = c.Start(ctx); err == nil {
				log.Warn("the PostgreSQL dev port was taken while PostgreSQL restarted, so it listens on a free port",
					"want", want, "port", c.Port())
			}
		}
		if err != nil {
			return fmt.Errorf("securing the dev PostgreSQL in %s: %w", c.dataDir, err)
		}
	}
	return createDatabase(ctx, c, DevDatabase)
}

// attach returns a Cluster for the server that already runs in
// opts.DataDir, once it accepts connections. It refuses a server that
// listens on anything but 127.0.0.1.
func attach(ctx context.Context, opts Options) (*Cluster, error) {
	c, err := newCluster(opts)
	if err != nil {
		return nil, err
	}
	state, pf, err := inspectServer(c.dataDir)
	if err != nil {
		return nil, err
	}
	if state != stateRunning {
		// It stopped in the meantime.
		return Start(ctx, opts)
	}
	if pf.listenAddr != "127.0.0.1" || pf.port == 0 {
		return nil, fmt.Errorf("a PostgreSQL server (pid %d) already runs in %s, listening on %q port %d, "+
			"not as pal dev starts it (127.0.0.1 only): stop it (pg_ctl stop -D %s)",
			pf.pid, c.dataDir, pf.listenAddr, pf.port, c.dataDir)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.port, c.portFixed = pf.port, true
	if err := c.waitReady(ctx); err != nil {
		return nil, fmt.Errorf("using the PostgreSQL server (pid %d) that runs in %s: %w", pf.pid, c.dataDir, err)
	}
	c.running = true
	return c, nil
}

// devDataDir returns where Dev keeps the cluster asked for in abs: abs
// itself, unless the server's user cannot reach it (see Dev).
func devDataDir(ctx context.Context, binDir string, u serverUser, abs string, log *slog.Logger) (string, error) {
	if !u.switched || initialised(abs) {
		return abs, nil
	}
	sum := sha256.Sum256([]byte(abs))
	key := hex.EncodeToString(sum[:8])
	var bases []string
	if u.home != "" {
		bases = append(bases, u.home)
	}
	bases = append(bases, os.TempDir())
	for _, base := range bases {
		if dir := filepath.Join(base, "pal-dev", key, "pg"); initialised(dir) {
			log.Info("PostgreSQL keeps PAL's dev data outside the checkout, where user "+u.name+" can reach it",
				"want", abs, "data", dir)
			return dir, nil
		}
	}

	parent := filepath.Dir(abs)
	if err := makeDirs(parent); err != nil {
		return "", fmt.Errorf("creating %s for the dev PostgreSQL: %w", parent, err)
	}
	reason := u.canEnter(ctx, binDir, parent)
	if reason == nil {
		return abs, nil
	}
	var noAccess *noAccessError
	if !errors.As(reason, &noAccess) {
		return "", reason
	}
	for _, base := range bases {
		if u.canEnter(ctx, binDir, base) != nil {
			continue
		}
		dir, err := makeFallback(u, base, key, abs)
		if err != nil {
			return "", err
		}
		attrs := []any{"want", abs, "data", dir, "reason", reason}
		if base == os.TempDir() {
			attrs = append(attrs, "note", "the system may clean the temporary directory; the data may not last")
		}
		log.Warn("PostgreSQL keeps PAL's dev data outside the checkout, where user "+u.name+" can reach it", attrs...)
		return dir, nil
	}
	return "", fmt.Errorf("the dev PostgreSQL: %w; and it cannot reach %v either", reason, bases)
}

// makeFallback prepares base/pal-dev/key for the server's user and returns
// its pg subdirectory, which Init turns into the cluster. A file named source
// records abs.
func makeFallback(u serverUser, base, key, abs string) (string, error) {
	top := filepath.Join(base, "pal-dev")
	root := filepath.Join(top, key)
	if err := makeDirs(root); err != nil {
		return "", fmt.Errorf("creating %s for the dev PostgreSQL: %w", root, err)
	}
	for _, dir := range []string{top, root} {
		fi, err := os.Lstat(dir)
		if err != nil {
			return "", fmt.Errorf("checking %s: %w", dir, err)
		}
		if !fi.IsDir() {
			return "", fmt.Errorf("%s is not a directory (a symbolic link?); remove it", dir)
		}
	}
	if err := u.chown(top, root); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(root, "source"), []byte(abs+"\n"), 0o644); err != nil {
		return "", fmt.Errorf("recording where %s comes from: %w", root, err)
	}
	return filepath.Join(root, "pg"), nil
}

// CreateDatabase creates database name on c unless it exists, for a
// second database beside DevDatabase.
func (c *Cluster) CreateDatabase(ctx context.Context, name string) error {
	return createDatabase(ctx, c, name)
}

// createDatabase creates database name on c unless it exists.
func createDatabase(ctx context.Context, c *Cluster, name string) error {
	conn, err := pgx.Connect(ctx, c.DSN("postgres"))
	if err != nil {
		return fmt.Errorf("connecting to the dev PostgreSQL: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil {
		return fmt.Errorf("looking for database %s: %w", name, err)
	}
	if exists {
		return nil
	}
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P04" { // duplicate_database: created meanwhile
		return nil
	}
	if err != nil {
		return fmt.Errorf("creating database %s: %w", name, err)
	}
	return nil
}
