package pgcluster

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// pidFile is what a postmaster writes to postmaster.pid in its data
// directory: its pid, data directory, start time, port, first socket
// directory, first listen address, shared memory key and status.
type pidFile struct {
	raw        []byte
	pid        int
	port       int
	socketDir  string
	listenAddr string
	status     string // "starting", "ready", "stopping", "standby" or ""
}

// readPIDFile reads dataDir/postmaster.pid. It returns an error matching
// os.ErrNotExist when there is none, and a pidFile with pid 0 when the file
// is empty or cannot be parsed (a server that died while writing it).
func readPIDFile(dataDir string) (pidFile, error) {
	raw, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return pidFile{}, err
	}
	pf := pidFile{raw: raw}
	lines := strings.Split(string(raw), "\n")
	line := func(i int) string {
		if i < len(lines) {
			return strings.TrimSpace(lines[i])
		}
		return ""
	}
	pf.pid, _ = strconv.Atoi(line(0))
	pf.port, _ = strconv.Atoi(line(3))
	pf.socketDir = line(4)
	pf.listenAddr = line(5)
	pf.status = line(7)
	return pf, nil
}

// serverState is what a data directory's postmaster.pid says once checked
// against the process table.
type serverState int

const (
	stateStopped serverState = iota // no postmaster.pid
	stateRunning                    // a live postmaster in this data directory
	stateStale                      // postmaster.pid of a server that is gone
)

// inspectServer reads dataDir's postmaster.pid and checks its pid. A pid
// that is gone, a zombie (a postmaster killed with SIGKILL whose new parent
// does not reap it, as in containers whose init is not an init) or a live
// process whose working directory is not dataDir (the pid was reused) makes
// the file stale. A live process whose working directory cannot be read
// counts as the postmaster.
func inspectServer(dataDir string) (serverState, pidFile, error) {
	pf, err := readPIDFile(dataDir)
	if errors.Is(err, os.ErrNotExist) {
		return stateStopped, pf, nil
	}
	if err != nil {
		return stateStopped, pf, fmt.Errorf("reading the pid file of PostgreSQL data directory %s: %w", dataDir, err)
	}
	if pf.pid <= 0 {
		return stateStale, pf, nil
	}
	alive, cwd := inspectProcess(pf.pid)
	if !alive {
		return stateStale, pf, nil
	}
	if cwd != "" && !samePath(cwd, dataDir) {
		return stateStale, pf, nil
	}
	return stateRunning, pf, nil
}

// removeStale removes the postmaster.pid of a server that is gone, and the
// lock file of its Unix socket, when they still hold what pf read: the new
// server would refuse to start while a zombie holds their pid.
func removeStale(dataDir string, pf pidFile) error {
	path := filepath.Join(dataDir, "postmaster.pid")
	if cur, err := os.ReadFile(path); err == nil && string(cur) == string(pf.raw) {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("removing the stale pid file %s: %w", path, err)
		}
	}
	if pf.socketDir == "" || pf.port == 0 || pf.pid <= 0 {
		return nil
	}
	lock := filepath.Join(pf.socketDir, fmt.Sprintf(".s.PGSQL.%d.lock", pf.port))
	if cur, err := os.ReadFile(lock); err == nil {
		pid, _ := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(cur), "\n", 2)[0]))
		if pid == pf.pid {
			if err := os.Remove(lock); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("removing the stale socket lock file %s: %w", lock, err)
			}
		}
	}
	return nil
}

// samePath reports whether a and b name the same directory.
func samePath(a, b string) bool {
	if a == b {
		return true
	}
	fa, err1 := os.Stat(a)
	fb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(fa, fb)
}
