package eventstore_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
)

func def(name string, i int) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"name":%q,"nodes":[{"id":"start","type":"trigger","data":{"i":%d}}]}`, name, i))
}

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// New content makes the next version, the latest version's content again
// makes nothing, and every version stays readable as it was deployed.
func TestDeployWorkflowVersions(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{})
	ctx := t.Context()
	deploy := func(d json.RawMessage) (uint64, bool) {
		t.Helper()
		got, created, err := b.store.DeployWorkflow(ctx, "triage", d, "ci")
		require.NoError(t, err)
		require.Equal(t, sum(d), got.SHA256)
		return got.Version, created
	}
	for _, step := range []struct {
		def     json.RawMessage
		version uint64
		created bool
	}{{def("triage", 1), 1, true}, {def("triage", 1), 1, false}, {def("triage", 2), 2, true},
		{def("triage", 2), 2, false}, {def("triage", 1), 3, true}} {
		v, created := deploy(step.def)
		require.Equal(t, step.version, v)
		require.Equal(t, step.created, created, "version %d", v)
	}
	for v, want := range map[uint64]json.RawMessage{0: def("triage", 1), 1: def("triage", 1), 2: def("triage", 2), 3: def("triage", 1)} {
		got, err := b.store.DeployedWorkflow(ctx, "triage", v)
		require.NoError(t, err)
		require.JSONEq(t, string(want), string(got.Definition))
		require.Equal(t, "ci", got.By)
		require.False(t, got.At.IsZero())
		if v == 0 {
			require.Equal(t, uint64(3), got.Version, "version 0 is the latest")
		}
	}
	_, err := b.store.DeployedWorkflow(ctx, "triage", 4)
	require.ErrorIs(t, err, eventstore.ErrWorkflowNotFound)
	require.ErrorContains(t, err, "the latest version is 3")
	_, err = b.store.DeployedWorkflow(ctx, "nobody", 0)
	require.ErrorIs(t, err, eventstore.ErrWorkflowNotFound)

	versions, err := b.store.WorkflowVersions(ctx, "triage")
	require.NoError(t, err)
	var nums []uint64
	for _, v := range versions {
		nums = append(nums, v.Version)
		require.Nil(t, v.Definition, "a listing reads no definitions")
	}
	require.Equal(t, []uint64{3, 2, 1}, nums)

	// Stored byte for byte: no HTML escaping changes a prompt, or the
	// sha256.
	html := json.RawMessage(`{"name":"html","nodes":[{"id":"start","type":"trigger","data":{"p":"<b>&amp;</b>"}}]}`)
	_, _, err = b.store.DeployWorkflow(ctx, "html", html, "ci")
	require.NoError(t, err)
	got, err := b.store.DeployedWorkflow(ctx, "html", 1)
	require.NoError(t, err)
	require.Equal(t, string(html), string(got.Definition))
	require.Equal(t, sum(html), got.SHA256)

	_, _, err = b.store.DeployWorkflow(ctx, "alpha", def("alpha", 1), "ops")
	require.NoError(t, err)
	list, err := b.store.DeployedWorkflows(ctx)
	require.NoError(t, err)
	require.Len(t, list, 3)
	require.Equal(t, event.Deployed{Name: "alpha", Version: 1, SHA256: sum(def("alpha", 1))}, list[0].Deployed)
	require.Equal(t, "html", list[1].Name)
	require.Equal(t, event.Deployed{Name: "triage", Version: 3, SHA256: sum(def("triage", 1))}, list[2].Deployed)
	require.Equal(t, "ops", list[0].By)
}

// Deploys of one name at once, from separate stores: every deploy that
// says it created a version has a version of its own, the versions are
// 1..n without a gap, each holds what the deploy that was told so sent,
// and the latest is the highest.
func TestDeployWorkflowRace(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{})
	ctx := t.Context()
	const deployers = 8
	type result struct {
		d       eventstore.DeployedWorkflow
		created bool
		i       int
		err     error
	}
	results := make(chan result, 2*deployers)
	var wg sync.WaitGroup
	for i := range deployers {
		for range 2 { // two deploys of each content
			wg.Go(func() {
				s := b.openStore(t)
				d, created, err := s.DeployWorkflow(ctx, "race", def("race", i), fmt.Sprint(i))
				results <- result{d, created, i, err}
			})
		}
	}
	wg.Wait()
	close(results)
	made := map[uint64]int{}
	var top uint64
	for r := range results {
		require.NoError(t, r.err)
		require.Equal(t, sum(def("race", r.i)), r.d.SHA256)
		got, err := b.store.DeployedWorkflow(ctx, "race", r.d.Version)
		require.NoError(t, err)
		require.JSONEq(t, string(def("race", r.i)), string(got.Definition), "version %d holds what its deploy sent", r.d.Version)
		if r.created {
			made[r.d.Version]++
		}
		top = max(top, r.d.Version)
	}
	for v, n := range made {
		require.Equal(t, 1, n, "version %d was created by %d deploys", v, n)
	}
	require.GreaterOrEqual(t, len(made), deployers, "each new content made a version")
	versions, err := b.store.WorkflowVersions(ctx, "race")
	require.NoError(t, err)
	require.Len(t, versions, int(top), "versions 1..%d, no gap", top)
	for i, v := range versions {
		require.Equal(t, top-uint64(i), v.Version)
	}
	latest, err := b.store.DeployedWorkflow(ctx, "race", 0)
	require.NoError(t, err)
	require.Equal(t, top, latest.Version)
}

// A deploy that stopped after writing its version, before moving the
// latest key: the version is not deployed (no start can name it), and the
// next deploy publishes it, taking it as its own when the content is the
// same.
func TestDeployWorkflowAfterAnInterruptedDeploy(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{})
	ctx := t.Context()
	_, _, err := b.store.DeployWorkflow(ctx, "half", def("half", 1), "ci")
	require.NoError(t, err)
	kv, err := b.js.KeyValue(ctx, eventstore.WorkflowBucket)
	require.NoError(t, err)
	orphan, err := json.Marshal(map[string]any{"sha256": sum(def("half", 2)), "by": "ci", "workflow": def("half", 2)})
	require.NoError(t, err)
	_, err = kv.Create(ctx, "half.2", orphan)
	require.NoError(t, err)

	_, err = b.store.DeployedWorkflow(ctx, "half", 2)
	require.ErrorIs(t, err, eventstore.ErrWorkflowNotFound)
	d, created, err := b.store.DeployWorkflow(ctx, "half", def("half", 2), "ci")
	require.NoError(t, err)
	require.Equal(t, uint64(2), d.Version)
	require.False(t, created, "the same content: the interrupted deploy's version")

	_, err = kv.Create(ctx, "half.3", orphan) // content 2 again, never published
	require.NoError(t, err)
	d, created, err = b.store.DeployWorkflow(ctx, "half", def("half", 4), "ci")
	require.NoError(t, err)
	require.True(t, created)
	require.Equal(t, uint64(4), d.Version, "version 3 was taken: published, and this one is the next")
	three, err := b.store.DeployedWorkflow(ctx, "half", 3)
	require.NoError(t, err)
	require.JSONEq(t, string(def("half", 2)), string(three.Definition))
}

// behindKV answers Get for the keys behind names as a follower that has
// not applied them yet would, their first misses times, and every other
// read as the bucket does.
type behindKV struct {
	jetstream.KeyValue
	behind func(key string) bool
	mu     sync.Mutex
	misses int
	gets   map[string]int
}

// versionKeys are the registry's version keys (name.version).
func versionKeys(key string) bool { return strings.Contains(key, ".") }

func (k *behindKV) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	k.mu.Lock()
	k.gets[key]++
	n := k.gets[key]
	k.mu.Unlock()
	if k.behind(key) && n <= k.misses {
		return nil, jetstream.ErrKeyNotFound
	}
	return k.KeyValue.Get(ctx, key)
}

// On a cluster each Direct Get may reach another replica: the latest key
// from one that has the deploy, the version's key from one behind it. A
// start reads the version again until the follower has it, and refuses a
// version that stays missing.
func TestDeployedWorkflowWaitsForAReplicaBehind(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{})
	ctx := t.Context()
	_, _, err := b.store.DeployWorkflow(ctx, "lag", def("lag", 1), "ci")
	require.NoError(t, err)
	kv, err := b.js.KeyValue(ctx, eventstore.WorkflowBucket)
	require.NoError(t, err)

	behind := &behindKV{KeyValue: kv, behind: versionKeys, misses: 2, gets: map[string]int{}}
	d, err := b.openStore(t).DeployedWorkflowVia(ctx, behind, "lag", 0)
	require.NoError(t, err)
	require.Equal(t, uint64(1), d.Version)
	require.JSONEq(t, string(def("lag", 1)), string(d.Definition))
	require.Equal(t, 3, behind.gets["lag.1"], "two misses, then the version")

	gone := &behindKV{KeyValue: kv, behind: versionKeys, misses: 1 << 30, gets: map[string]int{}}
	_, err = b.openStore(t).DeployedWorkflowVia(ctx, gone, "lag", 1)
	require.ErrorIs(t, err, eventstore.ErrWorkflowNotFound)
	require.Greater(t, gone.gets["lag.1"], 1, "read again before refusing")
}

// A schedule read on a replica that has not applied its create yet is
// read again until it is there; one that stays missing is not found.
func TestGetScheduleWaitsForAReplicaBehind(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{})
	ctx := t.Context()
	made, err := b.store.CreateSchedule(ctx, eventstore.Schedule{Name: "nightly", Every: "1h", Workflow: "hello", By: "ci"})
	require.NoError(t, err)
	kv, err := b.js.KeyValue(ctx, eventstore.ScheduleBucket)
	require.NoError(t, err)
	every := func(string) bool { return true }

	behind := &behindKV{KeyValue: kv, behind: every, misses: 2, gets: map[string]int{}}
	got, err := eventstore.GetScheduleVia(ctx, behind, "nightly")
	require.NoError(t, err)
	require.Equal(t, made.Revision, got.Revision)
	require.Equal(t, 3, behind.gets["nightly"], "two misses, then the schedule")

	gone := &behindKV{KeyValue: kv, behind: every, misses: 1 << 30, gets: map[string]int{}}
	_, err = eventstore.GetScheduleVia(ctx, gone, "nightly")
	require.ErrorIs(t, err, eventstore.ErrScheduleNotFound)
}

// A store keeps the versions it read (up to a size), and answers from one
// only while the latest key names it with its sha256: a redeploy from another store is
// seen at once, and so is a version key rewritten under the store (an
// operator's nats kv), once the latest key names the new content.
func TestDeployedWorkflowKeepsOnlyWhatTheLatestKeyNames(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{})
	ctx := t.Context()
	other := b.openStore(t)
	_, _, err := other.DeployWorkflow(ctx, "kept", def("kept", 1), "ci")
	require.NoError(t, err)
	latest := func(want json.RawMessage, version uint64) {
		t.Helper()
		got, err := b.store.DeployedWorkflow(ctx, "kept", 0)
		require.NoError(t, err)
		require.Equal(t, version, got.Version)
		require.JSONEq(t, string(want), string(got.Definition))
		require.Equal(t, sum(want), got.SHA256)
		require.False(t, got.At.IsZero(), "a kept version keeps its time")
	}
	latest(def("kept", 1), 1)
	latest(def("kept", 1), 1) // from the kept version

	_, _, err = other.DeployWorkflow(ctx, "kept", def("kept", 2), "ci")
	require.NoError(t, err)
	latest(def("kept", 2), 2)

	// Version 2 rewritten in place, and the latest key moved to its new
	// sha256: the kept copy no longer matches, and the key is read.
	kv, err := b.js.KeyValue(ctx, eventstore.WorkflowBucket)
	require.NoError(t, err)
	changed, err := json.Marshal(map[string]any{"sha256": sum(def("kept", 3)), "by": "ops", "workflow": def("kept", 3)})
	require.NoError(t, err)
	_, err = kv.Put(ctx, "kept.2", changed)
	require.NoError(t, err)
	pointer, err := json.Marshal(map[string]any{"version": 2, "sha256": sum(def("kept", 3)), "by": "ops"})
	require.NoError(t, err)
	_, err = kv.Put(ctx, "kept", pointer)
	require.NoError(t, err)
	latest(def("kept", 3), 2)
	require.True(t, b.store.VersionKept("kept", 2))

	// A definition over the bound is read each time, never kept.
	big := json.RawMessage(fmt.Sprintf(`{"name":"big","nodes":[{"id":"start","type":"trigger","data":{"pad":%q}}]}`,
		strings.Repeat("x", eventstore.MaxCachedDefinition)))
	_, _, err = other.DeployWorkflow(ctx, "big", big, "ci")
	require.NoError(t, err)
	for range 2 {
		got, err := b.store.DeployedWorkflow(ctx, "big", 0)
		require.NoError(t, err)
		require.Equal(t, sum(big), got.SHA256)
	}
	require.False(t, b.store.VersionKept("big", 1))
}

// A name that is no key, and a definition over the bucket's value limit,
// are refused before anything is written.
func TestDeployWorkflowBounds(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{})
	ctx := t.Context()
	for _, name := range []string{"", "a.b", "a*", "a>", "tri age", "a@1", strings.Repeat("n", event.MaxWorkflowNameLen+1)} {
		_, _, err := b.store.DeployWorkflow(ctx, name, def(name, 1), "ci")
		require.ErrorIs(t, err, event.ErrInvalidWorkflowName, "%q", name)
		_, err = b.store.DeployedWorkflow(ctx, name, 0)
		require.ErrorIs(t, err, event.ErrInvalidWorkflowName, "%q", name)
	}
	big := json.RawMessage(`{"name":"big","pad":"` + strings.Repeat("x", eventstore.MaxWorkflowValue) + `"}`)
	_, _, err := b.store.DeployWorkflow(ctx, "big", big, "ci")
	require.ErrorIs(t, err, eventstore.ErrPayloadTooLarge)
	require.ErrorContains(t, err, "the registry takes at most")
	info, err := b.js.Stream(ctx, eventstore.WorkflowStream)
	require.NoError(t, err)
	require.Zero(t, info.CachedInfo().State.Msgs, "nothing written")
	cfg := info.CachedInfo().Config
	require.Equal(t, int32(eventstore.MaxWorkflowValue), cfg.MaxMsgSize)
	require.Equal(t, int64(eventstore.WorkflowBucketBytes), cfg.MaxBytes)
	require.Equal(t, int64(1), cfg.MaxMsgsPerSubject, "a key holds one value: versions are keys of their own")
}
