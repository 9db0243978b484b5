package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// InitOption configures Init.
type InitOption func(*initConfig)

type initConfig struct {
	noSync bool
	binDir string
}

// NoSync makes initdb skip syncing the new files to disk (initdb --no-sync),
// which saves a second or so. For throwaway clusters only: after a power
// failure the data directory may be corrupt.
func NoSync() InitOption { return func(c *initConfig) { c.noSync = true } }

// WithBinDir runs initdb from dir instead of the directory BinDir finds.
func WithBinDir(dir string) InitOption { return func(c *initConfig) { c.binDir = dir } }

// Init makes dataDir a PostgreSQL data directory: initdb with the postgres
// superuser, UTF8 and the C locale, and scram-sha-256 authentication for
// every connection with a generated password, which Init keeps in
// PasswordFile in dataDir (mode 0600) and DSN puts in the URL. When PAL runs as
// root the directory belongs to the user the server will run as (postgres,
// else nobody), which must be able to reach it.
//
// Init is idempotent: a dataDir that already holds a cluster is left as it
// is, provided the installed PostgreSQL can run it (same major version). A
// dataDir that exists, is not empty and holds no cluster is an error. initdb
// runs in a directory next to dataDir that is renamed into place at the end,
// so an Init that is interrupted leaves no half-made cluster behind, and two
// concurrent calls for one dataDir both succeed with one cluster.
//
// Errors: ErrNotInstalled without PostgreSQL binaries; an error naming the
// directory when the server's user cannot reach it; initdb's output when it
// fails.
func Init(ctx context.Context, dataDir string, opts ...InitOption) error {
	var cfg initConfig
	for _, o := range opts {
		o(&cfg)
	}
	binDir, err := binDirOr(cfg.binDir)
	if err != nil {
		return err
	}
	dataDir, err = filepath.Abs(dataDir)
	if err != nil {
		return fmt.Errorf("initialising a PostgreSQL data directory: %w", err)
	}
	if initialised(dataDir) {
		return checkVersion(ctx, binDir, dataDir)
	}
	switch empty, err := isEmptyDir(dataDir); {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return fmt.Errorf("initialising PostgreSQL data directory %s: %w", dataDir, err)
	case !empty:
		return fmt.Errorf("initialising PostgreSQL data directory %s: it exists, is not empty and holds "+
			"no cluster (no PG_VERSION); remove it or choose another directory", dataDir)
	}

	u, err := currentServerUser()
	if err != nil {
		return err
	}
	parent := filepath.Dir(dataDir)
	if err := makeDirs(parent); err != nil {
		return fmt.Errorf("creating the parent of PostgreSQL data directory %s: %w", dataDir, err)
	}
	if err := u.canEnter(ctx, binDir, parent); err != nil {
		return fmt.Errorf("initialising PostgreSQL data directory %s: %w", dataDir, err)
	}
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(dataDir)+".init-")
	if err != nil {
		return fmt.Errorf("initialising PostgreSQL data directory %s: %w", dataDir, err)
	}
	defer os.RemoveAll(tmp)
	if err := u.chown(tmp); err != nil {
		return err
	}
	built := filepath.Join(tmp, "data")
	pw, err := newPassword()
	if err != nil {
		return err
	}
	pwFile := filepath.Join(tmp, PasswordFile)
	if err := writeSecret(u, pwFile, pw+"\n"); err != nil {
		return err
	}
	args := []string{"-D", built, "-U", "postgres", "-A", "scram-sha-256", "--pwfile", pwFile,
		"-E", "UTF8", "--no-locale"}
	if cfg.noSync {
		args = append(args, "--no-sync")
	}
	if err := u.run(ctx, binDir, tmp, "initdb", args...); err != nil {
		return fmt.Errorf("initialising PostgreSQL data directory %s: %w", dataDir, err)
	}
	// initdb's pg_hba.conf is close; PAL's says why, and secure writes the
	// same one.
	if err := os.WriteFile(filepath.Join(built, "pg_hba.conf"), []byte(hbaConf), 0o600); err != nil {
		return fmt.Errorf("initialising PostgreSQL data directory %s: writing pg_hba.conf: %w", dataDir, err)
	}
	if err := os.Rename(pwFile, filepath.Join(built, PasswordFile)); err != nil {
		return fmt.Errorf("initialising PostgreSQL data directory %s: %w", dataDir, err)
	}
	// rename(2) replaces an empty directory, but not on every platform.
	_ = os.Remove(dataDir)
	if err := os.Rename(built, dataDir); err != nil {
		if initialised(dataDir) {
			return nil // a concurrent Init was quicker
		}
		return fmt.Errorf("moving the new PostgreSQL cluster to %s: %w", dataDir, err)
	}
	if !cfg.noSync {
		if err := syncDir(parent); err != nil {
			return fmt.Errorf("initialising PostgreSQL data directory %s: %w", dataDir, err)
		}
	}
	return nil
}

// initialised reports whether dir holds a cluster made by initdb.
func initialised(dir string) bool {
	fi, err := os.Stat(filepath.Join(dir, "PG_VERSION"))
	return err == nil && fi.Mode().IsRegular()
}

// checkVersion fails when the cluster in dataDir was made by another major
// version of PostgreSQL than the one in binDir, which could not run it.
func checkVersion(ctx context.Context, binDir, dataDir string) error {
	b, err := os.ReadFile(filepath.Join(dataDir, "PG_VERSION"))
	if err != nil {
		return fmt.Errorf("reading the version of PostgreSQL data directory %s: %w", dataDir, err)
	}
	have := strings.TrimSpace(string(b))
	want, err := serverMajor(ctx, binDir)
	if err != nil {
		return err
	}
	if have != want {
		return fmt.Errorf("PostgreSQL data directory %s was made by PostgreSQL %s, but the installed server "+
			"(%s) is PostgreSQL %s: install PostgreSQL %s, or move the directory away to start afresh",
			dataDir, have, binDir, want, have)
	}
	return nil
}

func isEmptyDir(dir string) (bool, error) {
	f, err := os.Open(dir)
	if err != nil {
		return false, err
	}
	defer f.Close()
	if _, err := f.Readdirnames(1); err == io.EOF {
		return true, nil
	} else if err != nil {
		return false, err
	}
	return false, nil
}

// syncDir makes a rename in dir durable.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// makeDirs creates dir and any missing parents with mode 0755 whatever the
// umask, so that the server's user can pass through the directories PAL
// creates. Existing directories keep their mode.
func makeDirs(dir string) error {
	var created []string
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(d); err == nil || !errors.Is(err, os.ErrNotExist) || d == filepath.Dir(d) {
			break
		}
		created = append(created, d)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, d := range created {
		if err := os.Chmod(d, 0o755); err != nil {
			return err
		}
	}
	return nil
}
