package engine_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/workflow"
)

// run_created names the deployed version a run executes and the start's
// labels, and a child run, whose workflow is part of its parent's,
// carries its parent's.
func TestRunCreatedNamesTheDeployedVersion(t *testing.T) {
	t.Parallel()
	wf, err := workflow.Parse([]byte(`{"name":"triage","nodes":[{"id":"start","type":"trigger"}]}`))
	require.NoError(t, err)
	dep := &event.Deployed{Name: "triage", Version: 3, SHA256: wf.Hash()}
	labels := map[string]string{"customer": "acme"}
	ev, err := engine.RunCreated(engine.Creation{Workflow: wf, Input: json.RawMessage(`{}`), Deployed: dep, Labels: labels, By: "pal"})
	require.NoError(t, err)
	var d event.RunCreatedData
	require.NoError(t, ev.DecodeData(&d))
	require.Equal(t, dep, d.Deployed)
	require.Equal(t, labels, d.Labels)
	require.Equal(t, dep.SHA256, d.WorkflowHash)

	ev.RunID, ev.Seq = "run_parent", 1
	st, err := engine.Fold([]event.Event{ev})
	require.NoError(t, err)
	child, err := engine.ChildRunCreated(st, "sub", wf, json.RawMessage(`{}`), "", nil, nil, "w1", time.Unix(0, 0))
	require.NoError(t, err)
	var c event.RunCreatedData
	require.NoError(t, child.DecodeData(&c))
	require.Equal(t, dep, c.Deployed)
	require.Equal(t, labels, c.Labels, "a child carries its parent's labels")

	none, err := engine.RunCreated(engine.Creation{Workflow: wf, Input: json.RawMessage(`{}`), By: "pal"})
	require.NoError(t, err)
	require.NotContains(t, string(none.Data), `"deployed"`, "a plain-LLM run names none")
	require.NotContains(t, string(none.Data), `"labels"`, "no labels, none journaled")
}
