package palcli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/paltest/testenv"
	"github.com/palrun/pal/projections"
	"github.com/palrun/pal/provider/providertest"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// bundle is one test's PAL (see paltest.Stack) for the pal binary: an
// in-process worker whose LLM is the fake, and the binary.
type bundle struct {
	*paltest.Stack
	bin string
	dir string
}

func setup(t *testing.T) *bundle {
	t.Helper()
	b := &bundle{Stack: paltest.New(t), bin: testenv.PalBinary(t), dir: t.TempDir()}
	b.LLM.SetResponder(func(c providertest.Call) providertest.Reply {
		if strings.Contains(c.LastUser(), "FAIL") {
			return providertest.Reply{Status: 400}
		}
		return providertest.Reply{Text: "echo: " + c.LastUser()}
	})
	b.Worker(t, "w1", paltest.WorkerLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	return b
}

// result is one pal invocation.
type result struct {
	stdout, stderr string
	code           int
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// hermetic is the test's environment without PAL_*, DATABASE_URL and the
// providers' variables.
func hermetic(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PAL_") || strings.HasPrefix(kv, "DATABASE_URL=") ||
			strings.HasPrefix(kv, "OPENAI_") || strings.HasPrefix(kv, "ANTHROPIC_") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}

// pal runs the binary against the bundle's NATS with env added.
func (b *bundle) pal(t *testing.T, env []string, args ...string) result {
	t.Helper()
	return runPal(t, b.bin, append([]string{"PAL_NATS_URL=" + b.NATS.URL()}, env...), args...)
}

func runPal(t *testing.T, bin string, env []string, args ...string) result {
	t.Helper()
	return runPalIn(t, bin, "", env, args...)
}

// runPalIn runs the binary in directory dir ("" for the test's).
func runPalIn(t *testing.T, bin, dir string, env []string, args ...string) result {
	t.Helper()
	r, err := execPal(bin, dir, env, args...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// execPal is runPalIn for any goroutine: it returns what kept the binary
// from running instead of failing the test.
func execPal(bin, dir string, env []string, args ...string) (result, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	cmd.Env = hermetic(env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	default:
		return r, fmt.Errorf("running pal %s: %w", strings.Join(args, " "), err)
	}
	return r, nil
}

// file writes content to a file in the test's directory.
func (b *bundle) file(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(b.dir, name)
	require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
	return p
}

// start starts a run with the binary (Stack.Start goes round it) and returns
// its id.
func (b *bundle) start(t *testing.T, wf, input string) string {
	t.Helper()
	r := b.pal(t, nil, "run", "start", "--workflow", b.file(t, "wf.json", wf), "--input", input)
	require.Equal(t, 0, r.code, "%s", r)
	id := strings.TrimSpace(r.stdout)
	require.NoError(t, event.ValidateRunID(id), "%s", r)
	return id
}

// journal is what a refused command must leave as it was.
func (b *bundle) journal(t *testing.T) testenv.Journal { return testenv.ReadJournal(t, b.NC) }

func decodeJSON[T any](t *testing.T, s string) T {
	t.Helper()
	var v T
	require.NoError(t, json.Unmarshal([]byte(s), &v), "output: %s", s)
	return v
}

// seqWorkflow is a chain of n ai-steps s1..sn; a prompt with FAIL in it
// makes the fake LLM refuse the call.
func seqWorkflow(n int) string {
	return paltest.Chain(fmt.Sprintf("seq-%d", n), n, func(i int, _ string) (string, string) {
		id := fmt.Sprintf("s%d", i)
		return id, fmt.Sprintf(`{"id":%q,"type":"ai-step","data":{"provider":"openai","model":"gpt-4o-mini","prompt":"step %d: {{input.text}}"}}`, id, i)
	})
}

// projection is the bundle's journal projected into a fresh Postgres, as
// pal run list and pal run get with DATABASE_URL read it.
type projection struct {
	*projections.Projector
	// db points pal at it: DATABASE_URL.
	db []string
}

// project migrates a fresh Postgres and serves a projector of the
// bundle's journal into it.
func (b *bundle) project(t *testing.T) *projection {
	t.Helper()
	pg := testenv.Postgres(t)
	pool := pg.Pool(t)
	_, err := projections.Migrate(context.Background(), pool)
	require.NoError(t, err)
	p := projections.New(pool, b.Store, projections.Config{})
	b.Serve(t, "the projector", p)
	return &projection{Projector: p, db: []string{"DATABASE_URL=" + pg.DSN()}}
}

// caughtUp waits until the projection holds everything journaled so far.
func (p *projection) caughtUp(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, p.WaitCaughtUp(ctx))
}
