package runs_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/runs"
)

// An idempotency key is a name: one over MaxNameBytes is refused, naming
// the field, before anything is journaled, whether the body gives it or
// a durable command's Nats-Msg-Id does.
func TestIdempotencyKeyIsBounded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	wf := json.RawMessage(echoChain(1))
	var ie *runs.InputError

	long := strings.Repeat("k", runs.MaxNameBytes+1)
	_, err := b.Runs.Start(ctx, runs.StartCommand{Rights: runs.AllRights, Workflow: wf, IdempotencyKey: long})
	require.ErrorAs(t, err, &ie)
	require.Equal(t, "idempotency_key", ie.Field)
	require.Contains(t, ie.Msg, "the limit is 256")
	_, _, err = b.Store.Read(ctx, runs.RunIDForKey(long))
	require.ErrorIs(t, err, eventstore.ErrRunNotFound, "nothing journaled")

	body, _ := json.Marshal(map[string]any{"workflow": wf})
	_, _, err = b.Runs.Do(ctx, runs.CmdStart, body, long, runs.PALCaller("pal.cmd"))
	require.ErrorAs(t, err, &ie)
	require.Equal(t, "Nats-Msg-Id", ie.Field)
	_, _, err = b.Runs.Do(ctx, runs.CmdFork, []byte(`{"run_id":"run_x","from":"t1"}`), long[:runs.MaxNameBytes], runs.PALCaller("pal.cmd"))
	require.ErrorAs(t, err, &ie, "the fork's key is the id under the kind's name, over the limit too")
	require.Equal(t, "Nats-Msg-Id", ie.Field)

	at := strings.Repeat("k", runs.MaxNameBytes)
	res, err := b.Runs.Start(ctx, runs.StartCommand{Rights: runs.AllRights, Workflow: wf, IdempotencyKey: at})
	require.NoError(t, err, "a key at the limit is taken")
	require.Equal(t, runs.RunIDForKey(at), res.RunID)
}

// A number that is the right JSON type but does not fit its field is
// refused for what it is: not whole, or out of range, not "wrong type".
func TestNumbersThatDoNotFitSayWhy(t *testing.T) {
	t.Parallel()
	for body, want := range map[string][2]string{
		`{"run_id":"r","add_tokens":1.5}`:                              {"add_tokens", "1.5: must be a whole number"},
		`{"run_id":"r","add_steps":-0.25}`:                             {"add_steps", "-0.25: must be a whole number"},
		`{"run_id":"r","add_ms":1e3}`:                                  {"add_ms", "1e3: must be a whole number written in digits"},
		`{"run_id":"r","add_tokens":1e30}`:                             {"add_tokens", "1e30: out of range"},
		`{"run_id":"r","add_tokens":9223372036854775808}`:              {"add_tokens", "9223372036854775808: out of range"},
		`{"run_id":"r","add_usd":1e400}`:                               {"add_usd", "1e400: out of range"},
		`{"run_id":"r","add_usd":"5"}`:                                 {"add_usd", "wrong type: got string, want a number"},
		`{"run_id":"r","add_tokens":` + strings.Repeat("9", 500) + `}`: {"add_tokens", "out of range"},
	} {
		var cmd runs.BudgetCommand
		err := runs.DecodeStrict([]byte(body), &cmd)
		var ie *runs.InputError
		require.ErrorAs(t, err, &ie, body)
		require.Equal(t, want[0], ie.Field, body)
		require.Contains(t, ie.Msg, want[1], body)
		if !strings.Contains(body, `"5"`) {
			require.NotContains(t, ie.Msg, "want a number", "%s: the number is the right type", body)
		}
		require.Less(t, len(ie.Msg), 120, "a long number is cut")
	}
	var cmd runs.BudgetCommand
	require.NoError(t, runs.DecodeStrict([]byte(`{"run_id":"r","add_tokens":9223372036854775807,"add_usd":1e300}`), &cmd))
}
