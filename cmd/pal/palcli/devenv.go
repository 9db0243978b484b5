package palcli

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/spf13/cobra"
)

// pal dev writes how to reach it to dev.env in its data directory, so that
// the other pal commands run in that directory (pal run list, a second
// pal worker) reach the same NATS, Postgres and fake provider without
// copying variables by hand. Flags win over the environment, and the
// environment wins over the file.

// devEnvName is the file's name inside the data directory.
const devEnvName = "dev.env"

// defaultDataDir is PAL_HOME's default.
const defaultDataDir = ".pal"

// devEnvKey is what a variable name in dev.env must look like.
var devEnvKey = regexp.MustCompile(`^[A-Z_][A-Z0-9_]*$`)

// homeDir is pal dev's data directory as the environment names it:
// PAL_HOME, else PAL_DATA_DIR (its earlier name); "" when neither is set.
func homeDir(getenv func(string) string) string {
	if d := getenv("PAL_HOME"); d != "" {
		return d
	}
	return getenv("PAL_DATA_DIR")
}

// dataDir is pal dev's data directory: --data-dir, PAL_HOME or
// PAL_DATA_DIR, default ./.pal.
func (e *env) dataDir(cmd *cobra.Command) string {
	if f := cmd.Flags().Lookup("data-dir"); f != nil && f.Changed {
		return f.Value.String()
	}
	if d := homeDir(e.getenv); d != "" {
		return d
	}
	return defaultDataDir
}

// devEnvPath is where pal dev writes dev.env and where the other commands
// look for it: in PAL_HOME (or PAL_DATA_DIR) when set, else in the
// nearest .pal of this directory or its parents that holds one, so pal
// commands work from anywhere in the project; default ./.pal.
func devEnvPath(getenv func(string) string) string {
	if d := homeDir(getenv); d != "" {
		return filepath.Join(d, devEnvName)
	}
	if wd, err := os.Getwd(); err == nil {
		for dir := wd; ; dir = filepath.Dir(dir) {
			p := filepath.Join(dir, defaultDataDir, devEnvName)
			if _, err := os.Stat(p); err == nil {
				return p
			}
			if filepath.Dir(dir) == dir {
				break
			}
		}
	}
	return filepath.Join(defaultDataDir, devEnvName)
}

// useDevEnv makes e.getenv fall back to dev.env for every command but
// pal dev itself, which writes the file and must not read a stale one.
func (e *env) useDevEnv(cmd *cobra.Command, _ []string) error {
	if cmd.Name() == "dev" && cmd.Parent() == cmd.Root() {
		return nil
	}
	path := devEnvPath(e.getenv)
	vars, err := readDevEnv(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return badInput("reading %s (written by pal dev): %v", path, err)
	}
	procEnv := e.getenv
	e.getenv = func(k string) string {
		if v := procEnv(k); v != "" {
			return v
		}
		return vars[k]
	}
	return nil
}

// writeDevEnv writes vars to path, readable by its owner only: it holds an
// API token and the database's password. Keys are written in order.
func writeDevEnv(path string, keys []string, vars map[string]string) error {
	var b bytes.Buffer
	b.WriteString("# Written by pal dev while it runs; pal commands read it when their PAL_HOME\n")
	b.WriteString("# is this directory, or (unset) it is the nearest .pal above where they run.\n")
	b.WriteString("# Variables set in the environment win over these. Shell: . " + path + "\n")
	for _, k := range keys {
		if v, ok := vars[k]; ok {
			fmt.Fprintf(&b, "%s=%s\n", k, shellQuote(v))
		}
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b.Bytes(), 0o600); err != nil {
		return err
	}
	// WriteFile keeps the mode of a file that exists already.
	if err := os.Chmod(tmp, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// shellQuote quotes v for a POSIX shell: in single quotes, each quote in v
// written as a closing quote, an escaped quote and an opening quote.
func shellQuote(v string) string {
	return "'" + strings.ReplaceAll(v, "'", `'\''`) + "'"
}

// readDevEnv reads KEY=value lines; values may be quoted as shellQuote
// writes them. Blank lines and lines starting with # are skipped.
func readDevEnv(path string) (map[string]string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	vars := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(strings.TrimPrefix(line, "export "), "=")
		if !ok || !devEnvKey.MatchString(k) {
			return nil, fmt.Errorf("line %d: want KEY=value", n)
		}
		val, err := shellUnquote(v)
		if err != nil {
			return nil, fmt.Errorf("line %d: %s: %w", n, k, err)
		}
		vars[k] = val
	}
	return vars, sc.Err()
}

// shellUnquote undoes shellQuote, and takes bare words and backslash
// escapes as a shell does.
func shellUnquote(s string) (string, error) {
	var out strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				return "", errors.New("unterminated quote")
			}
			out.WriteString(s[i+1 : i+1+j])
			i += j + 1
		case '\\':
			if i+1 < len(s) {
				i++
				out.WriteByte(s[i])
			}
		default:
			out.WriteByte(c)
		}
	}
	return out.String(), nil
}
