package testenv

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
)

// build results are shared by every test in the test binary: each package is
// built at most once.
var builds struct {
	mu     sync.Mutex
	dir    string // lazily created; removed by Main
	byPkg  map[string]*buildResult
	seq    int
	natsMu sync.Mutex
	nats   *buildResult
}

type buildResult struct {
	once sync.Once
	path string
	err  error
}

// PalBinary builds ./cmd/pal once per test binary and returns the path of the
// executable. A failed build fails the test with the compiler's output.
func PalBinary(tb testing.TB) string {
	tb.Helper()
	return BuildBinary(tb, "./cmd/pal")
}

// BuildBinary builds the main package pkg once per test binary and returns
// the path of the executable. pkg is an import path or a path relative to the
// module root ("./cmd/pal"). Concurrent callers share one build; a failed
// build fails every caller's test with the compiler's output.
func BuildBinary(tb testing.TB, pkg string) string {
	tb.Helper()
	builds.mu.Lock()
	if builds.byPkg == nil {
		builds.byPkg = make(map[string]*buildResult)
	}
	r, ok := builds.byPkg[pkg]
	if !ok {
		r = &buildResult{}
		builds.byPkg[pkg] = r
	}
	builds.mu.Unlock()

	r.once.Do(func() {
		var dir string
		dir, r.err = buildDir()
		if r.err != nil {
			return
		}
		r.path = filepath.Join(dir, binaryName(pkg))
		r.err = goBuild(r.path, pkg)
	})
	if r.err != nil {
		tb.Fatalf("testenv: %v", r.err)
	}
	return r.path
}

// buildDir returns a fresh directory for one more binary inside the test
// binary's build directory.
func buildDir() (string, error) {
	builds.mu.Lock()
	defer builds.mu.Unlock()
	if builds.dir == "" {
		dir, err := os.MkdirTemp("", "pal-testenv-bin-")
		if err != nil {
			return "", fmt.Errorf("creating build directory: %w", err)
		}
		builds.dir = dir
	}
	builds.seq++
	dir := filepath.Join(builds.dir, fmt.Sprint(builds.seq))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", fmt.Errorf("creating build directory: %w", err)
	}
	return dir, nil
}

// removeBuilds deletes the binaries built by this test binary.
func removeBuilds() {
	builds.mu.Lock()
	defer builds.mu.Unlock()
	if builds.dir != "" {
		_ = os.RemoveAll(builds.dir)
		builds.dir = ""
		builds.byPkg = nil
	}
}

func binaryName(pkg string) string {
	name := filepath.Base(strings.TrimSuffix(pkg, "/"))
	if name == "." || name == "/" || name == "" {
		name = "main"
	}
	if runtime.GOOS == "windows" {
		name += ".exe"
	}
	return name
}

// goBuild runs `go build -o out pkg` in the module root.
func goBuild(out, pkg string) error {
	root, err := moduleRootDir()
	if err != nil {
		return err
	}
	goBin, err := goTool()
	if err != nil {
		return err
	}
	// -buildvcs=false: stamping needs git, which may refuse a checkout owned
	// by another user (CI containers) and buys a test binary nothing.
	cmd := exec.Command(goBin, "build", "-buildvcs=false", "-o", out, pkg)
	cmd.Dir = root
	var output bytes.Buffer
	cmd.Stdout = &output
	cmd.Stderr = &output
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build -o %s %s (in %s): %w\n%s", out, pkg, root, err, output.String())
	}
	return nil
}

func goTool() (string, error) {
	// go test puts its own GOROOT/bin first on PATH.
	if p, err := exec.LookPath("go"); err == nil {
		return p, nil
	}
	if root := os.Getenv("GOROOT"); root != "" {
		p := filepath.Join(root, "bin", "go")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("the go command is neither on PATH nor in $GOROOT/bin; building test binaries needs it")
}

var moduleRoot struct {
	once sync.Once
	dir  string
	err  error
}

// moduleRootDir returns the directory holding PAL's go.mod.
func moduleRootDir() (string, error) {
	moduleRoot.once.Do(func() {
		moduleRoot.dir, moduleRoot.err = findModuleRoot()
	})
	return moduleRoot.dir, moduleRoot.err
}

func findModuleRoot() (string, error) {
	// This file lives in <root>/paltest/testenv.
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		root := filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
		if isPalModule(root) {
			return root, nil
		}
	}
	// Built with -trimpath: ask the go command, from the test's directory.
	goBin, err := goTool()
	if err != nil {
		return "", err
	}
	out, err := exec.Command(goBin, "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("finding the module root with go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("finding the module root: not inside a Go module (go env GOMOD is empty)")
	}
	return filepath.Dir(gomod), nil
}

func isPalModule(dir string) bool {
	data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	return err == nil && bytes.Contains(data, []byte("module github.com/palrun/pal"))
}

// natsServerBinary returns the path of a nats-server executable built from
// the version in PAL's go.mod. The executable is cached under os.TempDir(),
// keyed by that version, the Go version and the platform, so later test runs
// reuse it; within one test binary the lookup happens once.
func natsServerBinary(tb testing.TB) string {
	tb.Helper()
	builds.natsMu.Lock()
	if builds.nats == nil {
		builds.nats = &buildResult{}
	}
	r := builds.nats
	builds.natsMu.Unlock()
	r.once.Do(func() { r.path, r.err = buildNATSServer() })
	if r.err != nil {
		tb.Fatalf("testenv: %v", r.err)
	}
	return r.path
}

const natsServerModule = "github.com/nats-io/nats-server/v2"

func buildNATSServer() (string, error) {
	root, err := moduleRootDir()
	if err != nil {
		return "", err
	}
	goBin, err := goTool()
	if err != nil {
		return "", err
	}
	cmd := exec.Command(goBin, "list", "-m", "-f",
		"{{.Path}}@{{.Version}}{{with .Replace}} => {{.Path}}@{{.Version}}{{end}}", natsServerModule)
	cmd.Dir = root
	version, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("finding the %s version (go list -m in %s): %w", natsServerModule, root, err)
	}
	sum := sha256.Sum256([]byte(strings.TrimSpace(string(version)) + "|" + runtime.Version() + "|" + runtime.GOOS + "/" + runtime.GOARCH))
	dir := filepath.Join(os.TempDir(), "pal-testenv-cache", "nats-server-"+hex.EncodeToString(sum[:8]))
	bin := filepath.Join(dir, binaryName("nats-server"))
	if fi, err := os.Stat(bin); err == nil && fi.Mode().IsRegular() {
		return bin, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("creating the nats-server cache: %w", err)
	}
	// Build under a private name and rename: test binaries of other packages
	// may build the same version at the same time.
	tmp, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		return "", fmt.Errorf("creating the nats-server cache: %w", err)
	}
	defer os.RemoveAll(tmp)
	built := filepath.Join(tmp, binaryName("nats-server"))
	if err := goBuild(built, natsServerModule); err != nil {
		return "", err
	}
	if err := os.Rename(built, bin); err != nil {
		return "", fmt.Errorf("caching the nats-server binary: %w", err)
	}
	return bin, nil
}
