package runs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/runs"
	"github.com/palrun/pal/workflow"
)

// created is a run's run_created payload.
func created(t *testing.T, b *bundle, runID string) event.RunCreatedData {
	t.Helper()
	return data[event.RunCreatedData](t, find(b.Events(t, runID), event.RunCreated, "")[0])
}

// A start names a deployed workflow (the latest version, or one), and its
// run_created journals that version's definition and names it; a start
// that brings a definition deploys it first.
func TestStartNamesADeployedWorkflow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	v1, v2 := echoChain(1), `{"name":"echo-1","nodes":[{"id":"start","type":"trigger"},{"id":"t1","type":"tool","data":{"tool":"echo","input":{"i":2}}}],"edges":[{"from":"start","to":"t1"}]}`
	d1 := b.Deploy(t, v1)
	require.Equal(t, runs.DeployResult{Name: "echo-1", Version: 1, SHA256: d1.SHA256, Created: true}, d1)
	start := func(wf string) event.RunCreatedData {
		t.Helper()
		res, err := b.Runs.Start(ctx, runs.StartCommand{Workflow: json.RawMessage(wf), Rights: runs.RightStart})
		require.NoError(t, err)
		return created(t, b, res.RunID)
	}
	for _, name := range []string{`"echo-1"`, `"echo-1@1"`} {
		c := start(name)
		require.Equal(t, &event.Deployed{Name: "echo-1", Version: 1, SHA256: d1.SHA256}, c.Deployed, name)
		require.JSONEq(t, v1, string(c.Workflow))
		require.Equal(t, d1.SHA256, c.WorkflowHash, "the deployed sha256 is the snapshot's hash")
	}
	d2 := b.Deploy(t, v2)
	require.Equal(t, uint64(2), d2.Version)
	require.Equal(t, uint64(2), start(`"echo-1"`).Deployed.Version, "the name is the latest version")
	c := start(`"echo-1@1"`)
	require.Equal(t, uint64(1), c.Deployed.Version)
	require.JSONEq(t, v1, string(c.Workflow), "an older version keeps its definition")

	// An inline start deploys: the same content is the latest version,
	// new content the next.
	res, err := b.Runs.Start(ctx, runs.StartCommand{Workflow: json.RawMessage(v2), Rights: runs.AllRights})
	require.NoError(t, err)
	require.Equal(t, &event.Deployed{Name: "echo-1", Version: 2, SHA256: d2.SHA256}, created(t, b, res.RunID).Deployed)
	res, err = b.Runs.Start(ctx, runs.StartCommand{Workflow: json.RawMessage(echoChain(2)), Rights: runs.AllRights})
	require.NoError(t, err)
	require.Equal(t, uint64(1), created(t, b, res.RunID).Deployed.Version)
	require.Equal(t, "echo-2", created(t, b, res.RunID).Deployed.Name)

	for wf, want := range map[string]error{`"nobody"`: runs.ErrWorkflowNotFound, `"echo-1@3"`: runs.ErrWorkflowNotFound} {
		_, err := b.Runs.Start(ctx, runs.StartCommand{Workflow: json.RawMessage(wf), Rights: runs.RightStart})
		require.ErrorIs(t, err, want, wf)
		code, _, _ := runs.Classify(err)
		require.Equal(t, runs.CodeNotFound, code)
	}
}

// What a caller may do is checked in the front door: with RightStart alone
// a start names a deployed workflow, and one that brings a definition, a
// plain-LLM start and a fork with another workflow are refused, naming
// the right, before anything is written or deployed; without RightStart
// nothing starts.
func TestRightsAreCheckedAtTheFrontDoor(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.worker(t, "w1", nil)
	src := b.Start(t, echoChain(1), `{}`)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, src).Kind)
	changed := json.RawMessage(echoChain(2)) // another workflow: echo-2

	for _, tc := range []struct {
		what  string
		do    func(runs.Rights) error
		field string
		need  runs.Rights
	}{
		{"inline start", func(r runs.Rights) error {
			_, err := b.Runs.Start(ctx, runs.StartCommand{Workflow: changed, RunID: "run_inline", Rights: r})
			return err
		}, "workflow", runs.RightDeploy},
		{"plain-LLM start", func(r runs.Rights) error {
			_, err := b.Runs.Start(ctx, runs.StartCommand{LLM: &runs.LLMSpec{Provider: "openai", Model: "gpt-4o", Prompt: "hi"}, RunID: "run_llm", Rights: r})
			return err
		}, "llm", runs.RightDeploy},
		{"fork with another workflow", func(r runs.Rights) error {
			_, err := b.Runs.Fork(ctx, runs.ForkCommand{RunID: src, From: "t1", Workflow: changed, NewRunID: "run_fork", Rights: r})
			return err
		}, "workflow", runs.RightDeploy},
		{"deploy", func(r runs.Rights) error {
			_, err := b.Runs.Deploy(ctx, runs.DeployCommand{Workflow: changed, Rights: r})
			return err
		}, "workflow", runs.RightDeploy},
		{"start by name without start", func(r runs.Rights) error {
			_, err := b.Runs.Start(ctx, runs.StartCommand{Workflow: json.RawMessage(`"echo-1"`), RunID: "run_named", Rights: r &^ runs.RightStart})
			return err
		}, "workflow", runs.RightStart},
		{"retry without start", func(r runs.Rights) error {
			_, err := b.Runs.Retry(ctx, runs.RetryCommand{RunID: src, NewRunID: "run_retry", Rights: r &^ runs.RightStart})
			return err
		}, "run_id", runs.RightStart},
	} {
		err := tc.do(runs.RightStart)
		var fe *runs.ForbiddenError
		require.ErrorAs(t, err, &fe, tc.what)
		require.ErrorIs(t, err, runs.ErrForbidden)
		require.Equal(t, tc.need, fe.Need, tc.what)
		require.Contains(t, err.Error(), "scope "+tc.need.String(), tc.what)
		code, field, final := runs.Classify(err)
		require.Equal(t, runs.CodeForbidden, code, tc.what)
		require.Equal(t, tc.field, field, tc.what)
		require.True(t, final)
	}
	for _, id := range []string{"run_inline", "run_llm", "run_fork", "run_named", "run_retry"} {
		_, _, err := b.Store.Read(ctx, id)
		require.ErrorIs(t, err, eventstore.ErrRunNotFound, "%s: nothing journaled", id)
	}
	_, err := b.Store.DeployedWorkflow(ctx, "echo-2", 0)
	require.ErrorIs(t, err, eventstore.ErrWorkflowNotFound, "a refused start deploys nothing")

	// With the right, the fork deploys its workflow, and the fork without
	// one keeps the source's deployed version.
	fork, err := b.Runs.Fork(ctx, runs.ForkCommand{RunID: src, From: "t1", Workflow: changed, Rights: runs.AllRights})
	require.NoError(t, err)
	require.Equal(t, "echo-2", created(t, b, fork.RunID).Deployed.Name)
	same, err := b.Runs.Fork(ctx, runs.ForkCommand{RunID: src, From: "t1", Rights: runs.RightStart})
	require.NoError(t, err)
	require.Equal(t, created(t, b, src).Deployed, created(t, b, same.RunID).Deployed)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, same.RunID).Kind)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, fork.RunID).Kind)

	// A refused start with a budget wider than its definition's deploys
	// nothing either.
	_, err = b.Runs.Start(ctx, runs.StartCommand{Workflow: json.RawMessage(budgeted), Budget: &workflow.Budget{MaxSteps: 50}, Rights: runs.AllRights})
	var ie *runs.InputError
	require.ErrorAs(t, err, &ie)
	require.Equal(t, "budget", ie.Field)
	_, err = b.Store.DeployedWorkflow(ctx, "budgeted", 0)
	require.ErrorIs(t, err, eventstore.ErrWorkflowNotFound)
}

// budgeted allows 5 steps.
const budgeted = `{"name":"budgeted","policy":{"budget":{"maxSteps":5}},"nodes":[{"id":"start","type":"trigger"}]}`

// A workflow name that is no key cannot be deployed, and neither can a
// definition under another name than the one asked for.
func TestDeployRefusesNames(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	for name, field := range map[string]string{"tri age": "workflow.name", "a.b": "workflow.name", "a@1": "workflow.name"} {
		wf := fmt.Sprintf(`{"name":%q,"nodes":[{"id":"start","type":"trigger"}]}`, name)
		_, err := b.Runs.Deploy(ctx, runs.DeployCommand{Workflow: json.RawMessage(wf), Rights: runs.RightDeploy})
		var ie *runs.InputError
		require.ErrorAs(t, err, &ie, name)
		require.Equal(t, field, ie.Field)
		require.ErrorIs(t, err, event.ErrInvalidWorkflowName)
	}
	_, err := b.Runs.Deploy(ctx, runs.DeployCommand{Workflow: json.RawMessage(echoChain(1)), Name: "other", Rights: runs.RightDeploy})
	require.ErrorContains(t, err, `workflow.name: "echo-1" is not the name the request deploys it as (other)`)
	_, err = b.Runs.Deploy(ctx, runs.DeployCommand{Workflow: json.RawMessage(`"echo-1"`), Rights: runs.RightDeploy})
	require.ErrorContains(t, err, "want the workflow definition")
}
