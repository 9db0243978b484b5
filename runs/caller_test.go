package runs_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/eventstore/natsauth"
	"github.com/palrun/pal/runs"
)

// TestCommandScopes: every command kind has the scope a NATS user needs
// for it (natsauth renders those into the users' permissions), and
// natsauth knows no kind runs does not carry out.
func TestCommandScopes(t *testing.T) {
	kinds := []string{runs.CmdStart, runs.CmdApprove, runs.CmdCancel, runs.CmdBudget, runs.CmdSignal,
		runs.CmdResume, runs.CmdFork, runs.CmdRetry}
	for _, k := range kinds {
		_, ok := natsauth.CommandScope(k)
		require.True(t, ok, "no scope for %s", k)
	}
	require.ElementsMatch(t, append(kinds, "get"), natsauth.Commands())
}
