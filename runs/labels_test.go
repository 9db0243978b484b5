package runs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/runs"
)

// A start's labels are journaled in run_created, through the client and
// the durable pal.cmd.runs.start; a fork carries its source's.
func TestStartJournalsLabels(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.commands(t)
	b.worker(t, "w1", nil)
	labels := map[string]string{"customer": "acme", "env": "prod"}
	res, err := b.Runs.Start(ctx, runs.StartCommand{Rights: runs.AllRights, Workflow: json.RawMessage(echoChain(2)), Labels: labels})
	require.NoError(t, err)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, res.RunID).Kind)
	require.Equal(t, labels, data[event.RunCreatedData](t, b.Events(t, res.RunID)[0]).Labels)

	fork, err := b.Runs.Fork(ctx, runs.ForkCommand{Rights: runs.AllRights, RunID: res.RunID, From: "t2"})
	require.NoError(t, err)
	require.Equal(t, labels, data[event.RunCreatedData](t, b.Events(t, fork.RunID)[0]).Labels, "a fork keeps its source's labels")

	ans := durable(t, b, "pal.cmd.runs.start", `{"workflow":`+echoChain(1)+`,"labels":{"customer":"globex"}}`, "")
	require.True(t, ans.OK, ans.Error)
	require.Equal(t, map[string]string{"customer": "globex"},
		data[event.RunCreatedData](t, b.Events(t, ans.RunID)[0]).Labels)

	plain := b.Start(t, echoChain(1), `{}`)
	require.Nil(t, data[event.RunCreatedData](t, b.Events(t, plain)[0]).Labels, "no labels, none journaled")
}

// Hostile labels are refused as the start's input error, naming labels,
// and nothing is journaled: too many, keys and values too long or of the
// wrong characters, and labels of the wrong JSON type.
func TestStartRefusesBadLabels(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var many []string
	for i := range event.MaxLabels + 1 {
		many = append(many, fmt.Sprintf(`"k%d":"v"`, i))
	}
	bodies := map[string]string{
		"too many":       `{` + strings.Join(many, ",") + `}`,
		"key too long":   `{"k` + strings.Repeat("x", 63) + `":"v"}`,
		"upper case key": `{"Customer":"acme"}`,
		"empty key":      `{"":"v"}`,
		"value too long": `{"k":"` + strings.Repeat("x", event.MaxLabelValueBytes+1) + `"}`,
		"NUL in a value": `{"k":"a\u0000b"}`,
		"a number":       `{"k":1}`,
		"nested":         `{"k":{"deeper":"v"}}`,
		"an array":       `["customer=acme"]`,
		"a string":       `"customer=acme"`,
		"null value":     `{"k":null}`,
	}
	for name, labels := range bodies {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			runID := event.NewRunID()
			body := fmt.Sprintf(`{"run_id":%q,"workflow":%s,"labels":%s}`, runID, echoChain(1), labels)
			var cmd runs.StartCommand
			err := runs.DecodeStrict([]byte(body), &cmd)
			if err == nil {
				cmd.Rights = runs.AllRights
				_, err = b.Runs.Start(ctx, cmd)
			}
			var ie *runs.InputError
			require.ErrorAs(t, err, &ie)
			require.True(t, strings.HasPrefix(ie.Field, "labels"), "field %q: %v", ie.Field, err)
			_, _, err = b.Store.Read(ctx, runID)
			require.ErrorIs(t, err, eventstore.ErrRunNotFound, "nothing journaled")
		})
	}
}
