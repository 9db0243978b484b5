package eventstore_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
)

// TestInvalidRunID checks that no method lets a run id widen a subject or
// a lease key: each refuses it at once, with a clear error, touching
// nothing.
func TestInvalidRunID(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{LeaseTTL: time.Second})
	ctx := t.Context()
	leases, err := eventstore.OpenLeases(ctx, b.js, time.Second)
	require.NoError(t, err)
	// Runs whose events a wildcard would match.
	for _, run := range []string{"run_a", "run_b"} {
		_, err := b.store.Append(ctx, run, eventstore.Head{}, ev(event.RunCreated, 1))
		require.NoError(t, err)
		require.NoError(t, b.store.Enqueue(ctx, "", run, "start"))
		_, err = leases.Acquire(ctx, run, "w1")
		require.NoError(t, err)
	}
	events, work := b.msgCount(t, eventstore.EventsStream), b.msgCount(t, eventstore.WorkStream)

	calls := map[string]func(id string) error{
		"Append": func(id string) error {
			_, err := b.store.Append(ctx, id, eventstore.Head{}, ev(event.RunCreated, 1))
			return err
		},
		"Read": func(id string) error {
			_, _, err := b.store.Read(ctx, id)
			return err
		},
		"ReadAfter": func(id string) error {
			_, _, err := b.store.ReadAfter(ctx, id, eventstore.Head{})
			return err
		},
		"LastHead": func(id string) error {
			_, err := b.store.LastHead(ctx, id)
			return err
		},
		"Watch": func(id string) error {
			return b.store.Watch(ctx, id, eventstore.Head{}, func(event.Event) error { return nil })
		},
		"Enqueue": func(id string) error { return b.store.Enqueue(ctx, "", id, "start") },
		"WorkPending": func(id string) error {
			_, err := b.store.WorkPending(ctx, "", id)
			return err
		},
		"Acquire": func(id string) error {
			_, err := leases.Acquire(ctx, id, "w1")
			return err
		},
		"Holder": func(id string) error {
			_, err := leases.Holder(ctx, id)
			return err
		},
		"WaitFree": func(id string) error { return leases.WaitFree(ctx, id) },
	}
	for name, call := range calls {
		for _, id := range []string{"*", ">", "run_*", "run.a", "run a", "", "run/1"} {
			start := time.Now()
			err := call(id)
			require.Error(t, err, "%s(%q)", name, id)
			require.Contains(t, err.Error(), "invalid run id", "%s(%q)", name, id)
			require.Less(t, time.Since(start), time.Second, "%s(%q) must refuse at once", name, id)
		}
	}
	require.Equal(t, events, b.msgCount(t, eventstore.EventsStream))
	require.Equal(t, work, b.msgCount(t, eventstore.WorkStream))
}
