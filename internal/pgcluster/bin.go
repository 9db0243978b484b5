package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// ErrNotInstalled means no PostgreSQL binaries were found. Its message says
// what to install, or to point PAL at a running server instead.
var ErrNotInstalled = errors.New("PostgreSQL was not found: no initdb and pg_ctl on PATH, " +
	"in `pg_config --bindir` or in /usr/lib/postgresql/*/bin. " +
	"Install it (Debian/Ubuntu: apt-get install postgresql) " +
	"or set DATABASE_URL to a PostgreSQL server PAL may use")

// BinDir returns the directory holding initdb, pg_ctl and postgres: the one
// initdb is in on PATH, else `pg_config --bindir`, else the highest version
// in /usr/lib/postgresql/*/bin (where Debian and Ubuntu install them, off
// PATH). It returns ErrNotInstalled if none has all three.
func BinDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		if dir := filepath.Dir(p); hasTools(dir) {
			return dir, nil
		}
	}
	if p, err := exec.LookPath("pg_config"); err == nil {
		if out, err := exec.Command(p, "--bindir").Output(); err == nil {
			if dir := strings.TrimSpace(string(out)); hasTools(dir) {
				return dir, nil
			}
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return dirVersion(dirs[i]) > dirVersion(dirs[j]) })
	for _, dir := range dirs {
		if hasTools(dir) {
			return dir, nil
		}
	}
	return "", ErrNotInstalled
}

// binDirOr returns dir, or BinDir() when dir is empty.
func binDirOr(dir string) (string, error) {
	if dir != "" {
		if !hasTools(dir) {
			return "", fmt.Errorf("%s does not hold initdb, pg_ctl and postgres: %w", dir, ErrNotInstalled)
		}
		return dir, nil
	}
	return BinDir()
}

func hasTools(dir string) bool {
	for _, prog := range []string{"initdb", "pg_ctl", "postgres"} {
		fi, err := os.Stat(filepath.Join(dir, prog))
		if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

// dirVersion extracts the version from /usr/lib/postgresql/<version>/bin as
// a sortable number (15 → 15000, 9.6 → 9006), or -1.
func dirVersion(binDir string) int {
	v := filepath.Base(filepath.Dir(binDir))
	major, minor, _ := strings.Cut(v, ".")
	ma, err := strconv.Atoi(major)
	if err != nil {
		return -1
	}
	mi, _ := strconv.Atoi(minor)
	return ma*1000 + mi
}

// serverMajor returns the major version of the PostgreSQL in binDir as
// PG_VERSION spells it ("15", "9.6"). It asks pg_ctl, which comes with the
// server and loads several times faster.
func serverMajor(ctx context.Context, binDir string) (string, error) {
	prog := filepath.Join(binDir, "pg_ctl")
	out, err := exec.CommandContext(ctx, prog, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("running %s --version: %w", prog, err)
	}
	// "pg_ctl (PostgreSQL) 15.14 (Debian 15.14-0+deb12u1)"
	fields := strings.Fields(string(out))
	if len(fields) < 3 {
		return "", fmt.Errorf("%s --version printed %q, want \"pg_ctl (PostgreSQL) <version>\"", prog, out)
	}
	return majorOf(fields[2]), nil
}

// majorOf returns the major part of a PostgreSQL version: "15.14" → "15",
// "17devel" → "17", "9.6.24" → "9.6".
func majorOf(version string) string {
	end := strings.IndexFunc(version, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	if end >= 0 {
		version = version[:end]
	}
	parts := strings.Split(version, ".")
	if n, err := strconv.Atoi(parts[0]); err == nil && n < 10 && len(parts) > 1 {
		return parts[0] + "." + parts[1]
	}
	return parts[0]
}
