package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/workflow"
)

// Exit codes.
const (
	ExitOK          = 0
	ExitRunFailed   = 1
	ExitBadInput    = 2
	ExitNotFound    = 3
	ExitUnavailable = 4
	ExitInternal    = 5
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

// codeOf maps an error to an exit code.
func codeOf(err error) int {
	var ee *exitError
	var ve *workflow.ValidationError
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, &ee):
		return ee.code
	case errors.As(err, &ve):
		return ExitBadInput
	case errors.Is(err, eventstore.ErrRunNotFound):
		return ExitNotFound
	case errors.Is(err, context.Canceled):
		return ExitInternal
	default:
		return ExitInternal
	}
}

// env is the process environment, swappable in tests.
type env struct {
	stdout, stderr io.Writer
	getenv         func(string) string
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
	err := root.ExecuteContext(ctx)
	if err == nil {
		return ExitOK
	}
	code := codeOf(err)
	if code == ExitInternal && strings.HasPrefix(err.Error(), "unknown ") || isUsage(err) {
		code = ExitBadInput
	}
	fmt.Fprintf(e.stderr, "pal: %v\n", err)
	return code
}

// isUsage recognises cobra's own usage errors.
func isUsage(err error) bool {
	msg := err.Error()
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
	root.AddCommand(e.workerCmd(), e.runCmd(), e.devCmd(), e.natsNodeCmd(), e.benchCmd())
	root.AddCommand(e.serverCmd(), e.versionCmd())
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
