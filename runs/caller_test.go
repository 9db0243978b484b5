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

// TestCallerReadsAndRights: a caller reads only with scope read (or
// admin), and its rights follow its scopes: start starts deployed
// workflows, deploy brings definitions, admin and PAL's own account do all.
func TestCallerReadsAndRights(t *testing.T) {
	starter := runs.UserCaller(natsauth.User{Name: "bot", Scopes: natsauth.ScopeStart})
	err := starter.Reads("pal.api.runs.get")
	var fe *runs.ForbiddenError
	require.ErrorAs(t, err, &fe)
	require.Contains(t, err.Error(), "bot lacks scope read")
	require.Equal(t, runs.RightStart, starter.Rights())

	reader := runs.UserCaller(natsauth.User{Name: "ana", Scopes: natsauth.ScopeRead})
	require.NoError(t, reader.Reads("pal.api.runs.get"))
	require.Equal(t, runs.Rights(0), reader.Rights())

	require.Equal(t, runs.AllRights, runs.UserCaller(natsauth.User{Name: "ops", Scopes: natsauth.ScopeStart | natsauth.ScopeDeploy}).Rights())
	require.Equal(t, runs.AllRights, runs.UserCaller(natsauth.User{Name: "root", Scopes: natsauth.ScopeAdmin}).Rights())
	require.Equal(t, runs.AllRights, runs.PALCaller("pal.api").Rights())
	require.NoError(t, runs.PALCaller("pal.api").Reads("pal.api.runs.get"))
}
