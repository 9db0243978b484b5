package natsauth_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/runs"
)

// TestWorkflowsUnderRoles: the worker and api roles deploy to
// PAL_WORKFLOWS (pal workflow deploy under dev.env, pal server, the NATS
// service's deploy endpoint) with no permissions violation; the client
// reads the registry, directly and through the service, and may neither
// request pal.api.workflows.deploy nor write the bucket: the server
// refuses both, and the registry is as it was.
func TestWorkflowsUnderRoles(t *testing.T) {
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := b.runs.Deploy(ctx, runs.DeployCommand{Workflow: json.RawMessage(echoWF), Rights: runs.AllRights})
	require.NoError(t, err, "the worker role deploys")
	require.Equal(t, uint64(1), res.Version)
	res, err = runs.New(b.apiStore).Deploy(ctx, runs.DeployCommand{Workflow: json.RawMessage(slowWF), Rights: runs.AllRights})
	require.NoError(t, err, "the api role deploys")
	require.Equal(t, "slow", res.Name)

	// The client reads: the service's list and get, and the bucket itself.
	m, err := b.client.RequestWithContext(ctx, "pal.api.workflows.list", nil)
	require.NoError(t, err)
	var list runs.WorkflowList
	require.NoError(t, json.Unmarshal(m.Data, &list), string(m.Data))
	require.Len(t, list.Workflows, 2)
	kv, err := b.cjs.KeyValue(ctx, eventstore.WorkflowBucket)
	require.NoError(t, err)
	e, err := kv.Get(ctx, "echo.1")
	require.NoError(t, err)
	require.Contains(t, string(e.Value()), `"name":"echo"`)
	keys, err := kv.ListKeys(ctx)
	require.NoError(t, err)
	var n int
	for range keys.Keys() {
		n++
	}
	require.Equal(t, 4, n, "echo, echo.1, slow, slow.1")
	require.Empty(t, b.cviol.all(), "reading is allowed")

	// The client may not deploy.
	info, err := b.cjs.Stream(ctx, eventstore.WorkflowStream)
	require.NoError(t, err)
	before := info.CachedInfo().State.LastSeq
	require.NoError(t, b.client.Publish(eventstore.WorkflowDeploySubject, []byte(echoWF)))
	b.cviol.wait(t, eventstore.WorkflowDeploySubject)
	// A refused publish is never acknowledged: the put gives up.
	pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
	defer pcancel()
	_, err = kv.Put(pctx, "echo.2", []byte(`{}`))
	require.Error(t, err)
	b.cviol.wait(t, "$KV."+eventstore.WorkflowBucket+".echo.2")
	info, err = b.cjs.Stream(ctx, eventstore.WorkflowStream)
	require.NoError(t, err)
	require.Equal(t, before, info.CachedInfo().State.LastSeq, "the registry is as it was")
}
