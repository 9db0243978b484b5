package testenv

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/palrun/pal/internal/pgcluster"
)

// pgMissing is the message a test fails with when no PostgreSQL is around.
const pgMissing = "PostgreSQL is needed and was not found: no initdb and pg_ctl on PATH, " +
	"in `pg_config --bindir` or in /usr/lib/postgresql/*/bin. " +
	"Install it (Debian/Ubuntu: apt-get install postgresql) so the tests can start a throwaway cluster, " +
	"or set DATABASE_URL to a server where this user may CREATE DATABASE"

// pgOpTimeout bounds each administrative statement (CREATE/DROP DATABASE).
const pgOpTimeout = time.Minute

// PG is a fresh, empty database for one test.
type PG struct {
	tb      testing.TB
	name    string
	dsn     string
	cluster *pgCluster // nil when the server comes from DATABASE_URL
}

// PGOption configures Postgres.
type PGOption func(*pgConfig)

type pgConfig struct {
	ownServer bool
}

// OwnServer gives the test a throwaway cluster of its own instead of the one
// the test binary shares, even when DATABASE_URL is set. Use it for tests
// that call StopServer while other tests run in parallel. It costs about a
// second (a copy of the cached initdb result and a server start) and needs
// the PostgreSQL binaries.
func OwnServer() PGOption { return func(c *pgConfig) { c.ownServer = true } }

// Postgres creates a new database, pal_test_<random>, for the test and drops
// it in the test's cleanup. The server is DATABASE_URL's when that is set
// (its user needs CREATEDB); otherwise a throwaway cluster that the first
// call starts from the machine's PostgreSQL binaries and Main removes. A
// missing PostgreSQL fails the test with what to install.
func Postgres(tb testing.TB, opts ...PGOption) *PG {
	tb.Helper()
	var cfg pgConfig
	for _, o := range opts {
		o(&cfg)
	}

	var (
		admin   string
		cluster *pgCluster
		err     error
	)
	if cfg.ownServer {
		cluster, err = newCluster()
		if err != nil {
			tb.Fatalf("testenv: %v", err)
		}
		tb.Cleanup(cluster.destroy)
		admin = cluster.adminDSN()
	} else {
		admin, cluster, err = sharedPostgres()
		if err != nil {
			tb.Fatalf("testenv: %v", err)
		}
	}

	name, err := randomName("pal_test_")
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	if err := createDatabase(admin, name); err != nil {
		tb.Fatalf("testenv: creating database %s: %v", name, err)
	}
	p := &PG{tb: tb, name: name, dsn: withDatabase(admin, name), cluster: cluster}
	tb.Cleanup(func() {
		if cfg.ownServer {
			return // the whole cluster goes away
		}
		if cluster != nil && !cluster.isRunning() {
			// The test stopped the server and left it stopped: start it
			// again for the tests that share it.
			if err := cluster.start(); err != nil {
				tb.Errorf("testenv: restarting PostgreSQL after the test stopped it: %v", err)
				return
			}
		}
		if err := dropDatabase(admin, name); err != nil {
			tb.Logf("testenv: dropping database %s: %v", name, err)
		}
	})
	return p
}

// DSN returns the connection string of the test's database.
func (p *PG) DSN() string { return p.dsn }

// Name returns the name of the test's database.
func (p *PG) Name() string { return p.name }

// Pool opens a connection pool to the test's database; the test's cleanup
// closes it.
func (p *PG) Pool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), pgOpTimeout)
	defer cancel()
	pool, err := pgxpool.New(ctx, p.dsn)
	if err != nil {
		tb.Fatalf("testenv: opening a pool to database %s: %v", p.name, err)
	}
	tb.Cleanup(pool.Close)
	if err := pool.Ping(ctx); err != nil {
		tb.Fatalf("testenv: connecting to database %s: %v", p.name, err)
	}
	return pool
}

// StopServer stops the throwaway cluster at once (pg_ctl stop -m immediate,
// as a crash would), for tests of what PAL does while Postgres is down. The
// cluster may be shared with the other tests of the binary: use OwnServer if
// tests run in parallel. If the test ends with the server stopped, its
// cleanup starts it again. A server from DATABASE_URL cannot be stopped: the
// test fails. Call it from the test's goroutine.
func (p *PG) StopServer() {
	p.tb.Helper()
	p.mustOwnCluster("StopServer")
	if err := p.cluster.stop(); err != nil {
		p.tb.Fatalf("testenv: stopping PostgreSQL: %v", err)
	}
}

// StartServer starts the cluster StopServer stopped, on the same port, and
// returns once it accepts connections. Call it from the test's goroutine.
func (p *PG) StartServer() {
	p.tb.Helper()
	p.mustOwnCluster("StartServer")
	if err := p.cluster.start(); err != nil {
		p.tb.Fatalf("testenv: starting PostgreSQL: %v", err)
	}
}

func (p *PG) mustOwnCluster(method string) {
	p.tb.Helper()
	if p.cluster == nil {
		p.tb.Fatalf("testenv: %s works only on the throwaway PostgreSQL cluster, but this database is on "+
			"the server named by DATABASE_URL; unset DATABASE_URL or call Postgres(t, testenv.OwnServer())", method)
	}
}

// shared is the server every Postgres call without OwnServer uses, set up by
// the first such call.
var shared struct {
	mu      sync.Mutex
	done    bool
	admin   string
	cluster *pgCluster
	err     error
}

func sharedPostgres() (admin string, cluster *pgCluster, err error) {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if !shared.done {
		shared.done = true
		if dsn := os.Getenv("DATABASE_URL"); dsn != "" {
			shared.admin = dsn
		} else {
			shared.cluster, shared.err = newCluster()
			if shared.err == nil {
				shared.admin = shared.cluster.adminDSN()
			}
		}
	}
	return shared.admin, shared.cluster, shared.err
}

// stopShared stops and removes the shared cluster, if one was started.
func stopShared() {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.cluster != nil {
		shared.cluster.destroy()
	}
	shared.done, shared.admin, shared.cluster, shared.err = false, "", nil, nil
}

// createDatabase creates database name. From PostgreSQL 15 on it copies the
// template's files (STRATEGY FILE_COPY): several times faster than the
// default WAL_LOG for a template this small, and the checkpoints it forces
// cost nothing with fsync off.
func createDatabase(admin, name string) error {
	return withAdmin(admin, func(ctx context.Context, conn *pgx.Conn, major int) error {
		sql := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize()
		if major >= 15 {
			sql += " STRATEGY FILE_COPY"
		}
		_, err := conn.Exec(ctx, sql)
		return err
	})
}

// dropDatabase drops database name, closing connections the test left open
// (PostgreSQL 13 and later).
func dropDatabase(admin, name string) error {
	return withAdmin(admin, func(ctx context.Context, conn *pgx.Conn, major int) error {
		sql := "DROP DATABASE IF EXISTS " + pgx.Identifier{name}.Sanitize()
		if major >= 13 {
			sql += " WITH (FORCE)"
		}
		_, err := conn.Exec(ctx, sql)
		return err
	})
}

// withAdmin runs f on a connection to admin, passing the server's major
// version.
func withAdmin(admin string, f func(ctx context.Context, conn *pgx.Conn, major int) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), pgOpTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return f(ctx, conn, majorVersion(conn.PgConn().ParameterStatus("server_version")))
}

// majorVersion returns the leading number of a server_version such as
// "15.18 (Debian 15.18-0+deb12u1)", or 0.
func majorVersion(version string) int {
	end := strings.IndexFunc(version, func(r rune) bool { return r < '0' || r > '9' })
	if end < 0 {
		end = len(version)
	}
	major, _ := strconv.Atoi(version[:end])
	return major
}

// withDatabase returns dsn (URL or keyword/value form) pointing at database
// name.
func withDatabase(dsn, name string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		if u, err := url.Parse(dsn); err == nil {
			u.Path = "/" + name
			u.RawPath = ""
			return u.String()
		}
	}
	// In keyword/value form the last setting wins.
	return dsn + " dbname=" + name
}

func randomName(prefix string) (string, error) {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generating a database name: %w", err)
	}
	return prefix + hex.EncodeToString(b), nil
}

// pgCluster is a throwaway PostgreSQL cluster (see pgcluster): a copy of
// the cached initdb template in a temporary directory, listening on
// 127.0.0.1 and a Unix socket in that directory, never syncing to disk
// (fsync and full_page_writes off).
//
// synchronous_commit stays on: with fsync off a commit costs one write(2),
// and turning it off would let StopServer (an immediate stop, like a crash)
// lose transactions the server had already acknowledged.
type pgCluster struct {
	base    string // removed by destroy
	cluster *pgcluster.Cluster
}

// pgStartTimeout bounds starting or stopping a throwaway cluster.
const pgStartTimeout = 2 * time.Minute

func newCluster() (*pgCluster, error) {
	binDir, err := pgcluster.BinDir()
	if errors.Is(err, pgcluster.ErrNotInstalled) {
		return nil, errors.New(pgMissing)
	}
	if err != nil {
		return nil, err
	}
	c, err := startCluster(binDir, false)
	if err != nil {
		// A template that the OS's temp cleaner has thinned out, or one
		// from a different build of the same version, may not start: make
		// a new one and try once more.
		c, err = startCluster(binDir, true)
	}
	return c, err
}

// startCluster creates a cluster from the initdb template (a fresh one if
// fresh is set) and starts it on a free port.
func startCluster(binDir string, fresh bool) (*pgCluster, error) {
	tmpl, err := pgTemplate(binDir, fresh)
	if err != nil {
		return nil, err
	}
	base, err := os.MkdirTemp("", "pal-testenv-pg-")
	if err != nil {
		return nil, fmt.Errorf("creating the PostgreSQL directory: %w", err)
	}
	// The template belongs to the server's user (postgres when the tests
	// run as root); so do the copy and the directory around it.
	if err := chownLike(tmpl, base); err != nil {
		_ = os.RemoveAll(base)
		return nil, err
	}
	data := filepath.Join(base, "data")
	if err := copyTree(tmpl, data); err != nil {
		_ = os.RemoveAll(base)
		return nil, fmt.Errorf("copying the initdb template %s: %w", tmpl, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), pgStartTimeout)
	defer cancel()
	cluster, err := pgcluster.Start(ctx, pgcluster.Options{
		DataDir:        data,
		SocketDir:      filepath.Join(base, "sock"),
		LogFile:        filepath.Join(base, "postgres.log"),
		MaxConnections: 200,
		BinDir:         binDir,
	})
	if err != nil {
		_ = os.RemoveAll(base)
		return nil, err
	}
	return &pgCluster{base: base, cluster: cluster}, nil
}

// templates guards the initdb template cache within the test binary.
var templates sync.Mutex

// templateKind names how pgTemplate initialises a template; it is part of
// the cache key.
const templateKind = "pgcluster.Init NoSync: initdb -U postgres -A scram-sha-256 --pwfile -E UTF8 --no-locale --no-sync"

// pgTemplate returns a data directory made by initdb, cached under
// os.TempDir() and keyed by the PostgreSQL build, its directory and the
// user the tests run as: initdb takes seconds, a copy of its result a
// fraction of one. With fresh, an existing template is replaced.
func pgTemplate(binDir string, fresh bool) (string, error) {
	templates.Lock()
	defer templates.Unlock()

	// pg_ctl names the same build as postgres and loads much faster.
	version, err := exec.Command(filepath.Join(binDir, "pg_ctl"), "--version").Output()
	if err != nil {
		return "", fmt.Errorf("running %s --version: %w", filepath.Join(binDir, "pg_ctl"), err)
	}
	sum := sha256.Sum256(fmt.Appendf(nil, "%s|%s|%d|%s", binDir, bytes.TrimSpace(version), os.Geteuid(), templateKind))
	parent := filepath.Join(os.TempDir(), "pal-testenv-cache")
	final := filepath.Join(parent, "pgdata-"+hex.EncodeToString(sum[:8]))
	if !fresh {
		if _, err := os.Stat(filepath.Join(final, "PG_VERSION")); err == nil {
			return final, nil
		}
	}
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return "", fmt.Errorf("creating the PostgreSQL template cache: %w", err)
	}
	// initdb into a private directory, then rename: test binaries of other
	// packages may make the same template at the same time.
	tmp, err := os.MkdirTemp(parent, "pgdata-build-")
	if err != nil {
		return "", fmt.Errorf("creating the PostgreSQL template cache: %w", err)
	}
	defer os.RemoveAll(tmp)
	// When the tests run as root, initdb runs as postgres and must reach it.
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", fmt.Errorf("creating the PostgreSQL template cache: %w", err)
	}
	data := filepath.Join(tmp, "data")
	ctx, cancel := context.WithTimeout(context.Background(), pgStartTimeout)
	defer cancel()
	if err := pgcluster.Init(ctx, data, pgcluster.NoSync(), pgcluster.WithBinDir(binDir)); err != nil {
		return "", err
	}
	if fresh {
		_ = os.RemoveAll(final)
	}
	if err := os.Rename(data, final); err != nil {
		if _, statErr := os.Stat(filepath.Join(final, "PG_VERSION")); statErr == nil {
			return final, nil // another test binary was quicker
		}
		return "", fmt.Errorf("caching the initdb template: %w", err)
	}
	return final, nil
}

// copyTree copies the directory src to dst (which must not exist), keeping
// permissions and, when the tests run as root, owners.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			if err := os.Mkdir(target, info.Mode().Perm()); err != nil {
				return err
			}
		case d.Type()&fs.ModeSymlink != 0:
			link, err := os.Readlink(path)
			if err != nil {
				return err
			}
			if err := os.Symlink(link, target); err != nil {
				return err
			}
		case d.Type().IsRegular():
			if err := copyFile(path, target, info.Mode().Perm()); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s: unexpected file type %v", path, d.Type())
		}
		return chownTo(info, target)
	})
}

// chownLike gives paths the owner of model when the tests run as root.
func chownLike(model string, paths ...string) error {
	info, err := os.Lstat(model)
	if err != nil {
		return err
	}
	return chownTo(info, paths...)
}

// chownTo gives paths the owner of the file info describes when the tests
// run as root: the cluster's files must belong to the user PostgreSQL runs
// as, because it refuses to run as root.
func chownTo(info fs.FileInfo, paths ...string) error {
	if os.Geteuid() != 0 {
		return nil
	}
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	for _, p := range paths {
		if err := os.Lchown(p, int(st.Uid), int(st.Gid)); err != nil {
			return fmt.Errorf("handing %s to uid %d: %w", p, st.Uid, err)
		}
	}
	return nil
}

func copyFile(src, dst string, perm fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func (c *pgCluster) adminDSN() string { return c.cluster.DSN("postgres") }

func (c *pgCluster) isRunning() bool { return c.cluster.Running() }

// start starts the server on its port and waits until it accepts
// connections.
func (c *pgCluster) start() error {
	ctx, cancel := context.WithTimeout(context.Background(), pgStartTimeout)
	defer cancel()
	return c.cluster.Start(ctx)
}

// stop stops the server without a shutdown checkpoint, as a crash would.
func (c *pgCluster) stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), pgStartTimeout)
	defer cancel()
	return c.cluster.Stop(ctx, pgcluster.StopImmediate)
}

// destroy stops the server and removes its directory.
func (c *pgCluster) destroy() {
	if err := c.stop(); err != nil {
		fmt.Fprintf(os.Stderr, "testenv: stopping the throwaway PostgreSQL cluster in %s: %v\n", c.base, err)
		return // leave the directory: the server may still use it
	}
	_ = os.RemoveAll(c.base)
}
