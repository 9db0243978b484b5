package testenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
)

// ChromiumEnv names a Chromium (or Chrome) binary for browser tests.
const ChromiumEnv = "PAL_CHROMIUM"

var chromium = sync.OnceValues(findOrInstallChromium)

// Chromium returns the path of a headless-capable Chromium for the
// browser tests: $PAL_CHROMIUM, else chromium, chromium-browser or
// google-chrome on PATH. When there is none it installs Debian's chromium
// package with apt-get (as root, or through sudo), as .ci/run does. It
// fails the test when no browser can be had: browser tests never skip.
func Chromium(tb testing.TB) string {
	tb.Helper()
	path, err := chromium()
	if err != nil {
		tb.Fatalf("browser tests need Chromium: %v (set %s to a Chromium binary, or install Debian's chromium package)", err, ChromiumEnv)
	}
	return path
}

func findOrInstallChromium() (string, error) {
	if p := os.Getenv(ChromiumEnv); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%s=%s: %w", ChromiumEnv, p, err)
		}
		return p, nil
	}
	if p, ok := chromiumOnPath(); ok {
		return p, nil
	}
	if err := installChromium(); err != nil {
		return "", err
	}
	if p, ok := chromiumOnPath(); ok {
		return p, nil
	}
	return "", errors.New("apt-get installed chromium but no chromium binary is on PATH")
}

func chromiumOnPath() (string, bool) {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, true
		}
	}
	return "", false
}

// installChromium installs Debian's chromium package.
func installChromium() error {
	if _, err := exec.LookPath("apt-get"); err != nil {
		return errors.New("no chromium on PATH and no apt-get to install it with")
	}
	var prefix []string
	if os.Geteuid() != 0 {
		if _, err := exec.LookPath("sudo"); err != nil {
			return errors.New("no chromium on PATH, and installing it needs root or sudo")
		}
		prefix = []string{"sudo", "-n"}
	}
	run := func(args ...string) error {
		args = append(prefix, args...)
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, lastLines(string(out), 5))
		}
		return nil
	}
	if err := run("apt-get", "update", "-qq"); err != nil {
		return err
	}
	return run("apt-get", "install", "-y", "-qq", "chromium")
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
