package pgcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// serverUser is the OS user PostgreSQL runs as.
type serverUser struct {
	name     string
	home     string
	uid, gid int
	switched bool // the programs run as this user, not the current one
}

// currentServerUser returns the user the cluster's programs run as: the
// current user, or, when that is root (PostgreSQL refuses to run as root),
// postgres if it exists (the PostgreSQL packages create it), else nobody.
func currentServerUser() (serverUser, error) {
	if os.Geteuid() != 0 {
		return serverUser{}, nil
	}
	var errs []error
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 != nil || err2 != nil {
			errs = append(errs, fmt.Errorf("user %s has a non-numeric uid %q or gid %q", name, u.Uid, u.Gid))
			continue
		}
		return serverUser{name: name, home: u.HomeDir, uid: int(uid), gid: int(gid), switched: true}, nil
	}
	return serverUser{}, fmt.Errorf("running as root, PostgreSQL needs an unprivileged user to run as, "+
		"and neither postgres nor nobody exists: %w", errors.Join(errs...))
}

// chown hands paths to the server's user; it does nothing when PostgreSQL
// runs as the current user.
func (u serverUser) chown(paths ...string) error {
	if !u.switched {
		return nil
	}
	for _, p := range paths {
		if err := os.Lchown(p, u.uid, u.gid); err != nil {
			return fmt.Errorf("handing %s to user %s: %w", p, u.name, err)
		}
	}
	return nil
}

// canEnter checks that the server's user can reach dir (search permission on
// it and every parent), by starting `pg_ctl --version` (small, quick to load)
// as that user in dir: the kernel judges, ACLs and all. It returns nil at once
// when PostgreSQL runs as the current user.
func (u serverUser) canEnter(ctx context.Context, binDir, dir string) error {
	if !u.switched {
		return nil
	}
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "pg_ctl"), "--version")
	cmd.Dir = dir
	cmd.Env = serverEnv()
	cmd.SysProcAttr = u.procAttr()
	err := cmd.Run()
	if err == nil {
		return nil
	}
	if errors.Is(err, fs.ErrPermission) {
		return &noAccessError{user: u.name, dir: dir}
	}
	return fmt.Errorf("checking that user %s can enter %s: %w", u.name, dir, err)
}

// noAccessError is canEnter's verdict that the server's user cannot reach a
// directory.
type noAccessError struct {
	user, dir string
}

func (e *noAccessError) Error() string {
	return fmt.Sprintf("PostgreSQL runs as user %s because PAL runs as root, and %s cannot enter %s "+
		"(it needs search permission, x, on that directory and on every parent)", e.user, e.user, e.dir)
}

// run runs the PostgreSQL program prog from binDir in dir as the server's
// user and returns an error quoting its output if it fails.
func (u serverUser) run(ctx context.Context, binDir, dir, prog string, args ...string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, prog), args...)
	cmd.Dir = dir
	cmd.Env = serverEnv()
	cmd.SysProcAttr = u.procAttr()
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	// pg_ctl's server writes to its log file, but never let a stray
	// inherited descriptor hold Wait.
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w\n%s", prog, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

// serverEnv is the environment of the PostgreSQL programs: PATH, TMPDIR and
// TZ from ours, and the C locale, so that messages are in English and the
// cluster sorts the same everywhere. Nothing else: no PG* variable may
// redirect pg_ctl, and no PAL setting or provider key may reach a server that
// runs as another user (its environment is readable in /proc).
func serverEnv() []string {
	env := []string{"LC_ALL=C", "LANG=C"}
	for _, key := range []string{"PATH", "TMPDIR", "TZ"} {
		if v, ok := os.LookupEnv(key); ok {
			env = append(env, key+"="+v)
		}
	}
	return env
}
