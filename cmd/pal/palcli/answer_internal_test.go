package palcli

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/runs"
)

// TestAnswerOf: the one mapping from a command's error to its exit code
// and --json answer code, as docs/architecture.md §9.5 lists them.
func TestAnswerOf(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err    error
		exit   int
		answer string
	}{
		{nil, ExitOK, ""},
		{&runs.InputError{Field: "budget", Err: errors.New("widens")}, ExitBadInput, runs.CodeBadInput},
		{fmt.Errorf("approving: %w", runs.ErrRunFinished), ExitBadInput, runs.CodeConflict},
		{fmt.Errorf("getting: %w", eventstore.ErrRunNotFound), ExitNotFound, runs.CodeNotFound},
		{fmt.Errorf("starting: %w", eventstore.ErrWorkflowNotFound), ExitNotFound, runs.CodeNotFound},
		{&runs.ForbiddenError{Need: runs.RightDeploy, Field: "workflow", What: "x"}, ExitBadInput, runs.CodeForbidden},
		{fmt.Errorf("reading: %w", event.ErrBlob), ExitInternal, runs.CodeInternal},
		{fmt.Errorf("folding: %w", engine.ErrUnfoldable), ExitInternal, runs.CodeInternal},
		{errors.New("nats: timeout"), ExitUnavailable, runs.CodeUnavailable},
		{context.Canceled, ExitInternal, runs.CodeInternal},
		{withCode(ExitUnavailable, errors.New("postgres down")), ExitUnavailable, runs.CodeUnavailable},
		{&natsRefusal{who: "x", err: nats.ErrAuthorization, login: true}, ExitBadInput, "forbidden"},
		{&natsRefusal{who: "x", err: nats.ErrPermissionViolation}, ExitBadInput, "forbidden"},
	} {
		exit, answer := answerOf(c.err)
		require.Equal(t, c.exit, exit, "%v", c.err)
		require.Equal(t, c.answer, answer, "%v", c.err)
	}
}
