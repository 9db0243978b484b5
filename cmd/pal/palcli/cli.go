package palcli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"

	"github.com/spf13/cobra"

	"github.com/palrun/pal/runs"
)

// Exit codes.
const (
	ExitOK          = 0
	ExitRunFailed   = 1
	ExitBadInput    = 2
	ExitNotFound    = 3
	ExitUnavailable = 4
	ExitInternal    = 5
	// ExitInterrupted: Ctrl-C (or SIGTERM) stopped a command that follows
	// a run (run start --wait, run watch); the run goes on.
	ExitInterrupted = 130
)

// exitError carries an exit code with its error.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func withCode(code int, err error) error {
	if err == nil {
		return nil
	}
	return &exitError{code: code, err: err}
}

func badInput(format string, args ...any) error {
	return withCode(ExitBadInput, fmt.Errorf(format, args...))
}

// codeOf maps an error to an exit code (see answerOf).
func codeOf(err error) int {
	code, _ := answerOf(err)
	return code
}

// answerOf is the one mapping from a command's error to its exit code and
// the answer code --json prints (the REST API's): a permissions violation
// NATS reported is 2 (forbidden); a code the command set wins; then
// runs.Classify decides — bad_input, conflict and lease_held exit 2,
// not_found 3, unavailable 4, internal 5; cobra's usage errors are bad
// input; an interrupted command exits 5 too. The answer code always agrees
// with the exit code.
func answerOf(err error) (exit int, answer string) {
	if err == nil {
		return ExitOK, ""
	}
	answer, _, final := runs.Classify(err)
	var ee *exitError
	var nr *natsRefusal
	switch {
	case errors.As(err, &nr):
		// Refused for good, like REST's 403: other credentials, not a
		// retry, are the fix.
		return ExitBadInput, "forbidden"
	case errors.As(err, &ee):
		exit = ee.code
	case errors.Is(err, context.Canceled):
		return ExitInternal, runs.CodeInternal
	case !final && isUsage(err):
		return ExitBadInput, runs.CodeBadInput
	default:
		exit = exitOfAnswer(answer)
	}
	if exitOfAnswer(answer) != exit {
		// The command knew better (a Postgres it cannot reach, a file it
		// cannot write): the answer code says what the exit code says.
		answer = map[int]string{ExitRunFailed: "failed", ExitBadInput: runs.CodeBadInput, ExitNotFound: runs.CodeNotFound,
			ExitUnavailable: runs.CodeUnavailable, ExitInternal: runs.CodeInternal, ExitInterrupted: "interrupted"}[exit]
	}
	return exit, answer
}

// exitOfAnswer is the exit code of an answer code.
func exitOfAnswer(answer string) int {
	switch answer {
	case runs.CodeBadInput, runs.CodeForbidden, runs.CodeConflict, runs.CodeLeaseHeld:
		return ExitBadInput
	case runs.CodeNotFound:
		return ExitNotFound
	case runs.CodeInternal:
		return ExitInternal
	default: // unavailable, and what nothing classifies
		return ExitUnavailable
	}
}

// env is the process environment, swappable in tests.
type env struct {
	stdout, stderr io.Writer
	getenv         func(string) string
	// refused is the permissions violation NATS reported on the
	// command's connection, if any (connectNow).
	refused atomic.Pointer[natsRefusal]
}

// Main runs the pal command with args and returns the exit code.
func Main(ctx context.Context, args []string) int {
	e := &env{stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv}
	return e.run(ctx, args)
}

func (e *env) run(ctx context.Context, args []string) int {
	root := e.rootCmd()
	root.SetArgs(args)
	root.SetOut(e.stdout)
	root.SetErr(e.stderr)
	err := e.explain(root.ExecuteContext(ctx))
	if err == nil {
		return ExitOK
	}
	code := codeOf(err)
	fmt.Fprintf(e.stderr, "pal: %v\n", err)
	return code
}

// isUsage recognises cobra's own usage errors.
func isUsage(err error) bool {
	msg := err.Error()
	if strings.HasPrefix(msg, "unknown ") {
		return true
	}
	for _, p := range []string{"unknown command", "unknown flag", "unknown shorthand", "accepts ", "requires at least", "required flag", "invalid argument", "flag needs an argument"} {
		if strings.Contains(msg, p) {
			return true
		}
	}
	return false
}

func (e *env) rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "pal",
		Short: "PAL: durable execution for AI-agent runs",
		Long: `PAL runs workflow graphs and agent loops durably: every step is journaled
to NATS JetStream as it happens, so a crash never loses work, re-spends
tokens or fires a side effect twice.

Start everything locally with 'pal dev'; see 'pal run --help' to start and
inspect runs.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		// Settings pal dev wrote to .pal/dev.env fill in what the
		// environment leaves unset.
		PersistentPreRunE: e.useDevEnv,
	}
	root.PersistentFlags().String("nats-url", "", "NATS server URL (env PAL_NATS_URL, default nats://127.0.0.1:4222)")
	root.AddCommand(e.workerCmd(), e.runCmd(), e.workflowCmd(), e.scheduleCmd(), e.devCmd(), e.natsNodeCmd(), e.benchCmd())
	root.AddCommand(e.serverCmd(), e.versionCmd(), e.workersCmd(), e.mcpCmd(), e.threadCmd())
	root.AddCommand(e.migrateCmd(), e.projectorCmd(), e.projectionsCmd())
	// Signed receipts.
	root.AddCommand(e.receiptCmd())
	return root
}

// logger returns the process logger: text to stderr, level from
// PAL_LOG_LEVEL (debug, info, warn, error; default info).
func (e *env) logger() (*slog.Logger, error) {
	var lvl slog.Level
	if v := e.getenv("PAL_LOG_LEVEL"); v != "" {
		if err := lvl.UnmarshalText([]byte(v)); err != nil {
			return nil, badInput("PAL_LOG_LEVEL=%q: want debug, info, warn or error", v)
		}
	}
	return slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: lvl})), nil
}
