package eventstore_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/eventstore"
)

const leaseTTL = time.Second

func openLeases(t *testing.T) (*testBundle, *eventstore.Leases) {
	t.Helper()
	b := setup(t, eventstore.Config{LeaseTTL: leaseTTL})
	l, err := eventstore.OpenLeases(t.Context(), b.js, leaseTTL)
	require.NoError(t, err)
	require.Equal(t, leaseTTL, l.TTL())
	return b, l
}

// requireHeldBy checks that owner holds the run's lease: the holder is
// named and another owner's Acquire fails naming it.
func requireHeldBy(t *testing.T, l *eventstore.Leases, run, owner string) {
	t.Helper()
	holder, err := l.Holder(t.Context(), run)
	require.NoError(t, err)
	require.Equal(t, owner, holder)
	_, err = l.Acquire(t.Context(), run, "intruder")
	var held *eventstore.LeaseHeldError
	require.ErrorAs(t, err, &held)
	require.Equal(t, owner, held.Owner)
}

// acquireWhenFree polls Acquire until it succeeds or within has passed.
func acquireWhenFree(t *testing.T, l *eventstore.Leases, run, owner string, within time.Duration) *eventstore.Lease {
	t.Helper()
	var ls *eventstore.Lease
	eventually(t, within, 20*time.Millisecond, func() bool {
		var err error
		ls, err = l.Acquire(t.Context(), run, owner)
		if err != nil {
			require.ErrorIs(t, err, eventstore.ErrLeaseHeld)
		}
		return err == nil
	}, "lease on %s never became free", run)
	return ls
}

func TestLeaseAcquire(t *testing.T) {
	t.Parallel()
	_, l := openLeases(t)
	ctx := t.Context()

	holder, err := l.Holder(ctx, "run_l")
	require.NoError(t, err)
	require.Empty(t, holder, "no lease yet")

	ls, err := l.Acquire(ctx, "run_l", "w1")
	require.NoError(t, err)
	require.Equal(t, "run_l", ls.RunID)
	require.Equal(t, "w1", ls.Owner)
	require.Positive(t, ls.Revision)
	require.Equal(t, leaseTTL, ls.TTL())
	require.True(t, ls.Valid(time.Now()))

	_, err = l.Acquire(ctx, "run_l", "w2")
	require.Error(t, err)
	require.ErrorIs(t, err, eventstore.ErrLeaseHeld)
	var held *eventstore.LeaseHeldError
	require.ErrorAs(t, err, &held)
	require.Equal(t, eventstore.LeaseHeldError{RunID: "run_l", Owner: "w1"}, *held)
	require.Contains(t, held.Error(), "w1")

	// Held means held, even for its own owner.
	_, err = l.Acquire(ctx, "run_l", "w1")
	require.ErrorIs(t, err, eventstore.ErrLeaseHeld)

	// Leases are per run.
	other, err := l.Acquire(ctx, "run_l2", "w2")
	require.NoError(t, err)
	requireHeldBy(t, l, "run_l", "w1")
	requireHeldBy(t, l, "run_l2", "w2")
	require.NotEqual(t, ls.Revision, other.Revision)
}

func TestLeaseRenewKeepsIt(t *testing.T) {
	t.Parallel()
	_, l := openLeases(t)
	ctx := t.Context()
	ls, err := l.Acquire(ctx, "run_l", "w1")
	require.NoError(t, err)
	acquired := time.Now()

	tick := time.NewTicker(leaseTTL / 3)
	defer tick.Stop()
	rev := ls.Revision
	var renewed time.Time // when the last renewal was sent: its TTL runs from no earlier
	for time.Since(acquired) < 2*leaseTTL+leaseTTL/2 {
		<-tick.C
		renewed = time.Now()
		require.NoError(t, l.Renew(ctx, ls))
		require.Greater(t, ls.Revision, rev, "a renewal is a new revision")
		rev = ls.Revision
		require.True(t, ls.Valid(time.Now()))
		requireHeldBy(t, l, "run_l", "w1")
	}
	require.Greater(t, time.Since(acquired), 2*leaseTTL)
	requireHeldBy(t, l, "run_l", "w1")

	// Once renewals stop, the renewed lease expires too (a renewal that
	// dropped the TTL would keep it forever).
	ls2 := acquireWhenFree(t, l, "run_l", "w2", leaseTTL+2*time.Second)
	require.GreaterOrEqual(t, time.Since(renewed), leaseTTL-100*time.Millisecond, "expired before its TTL")
	require.Equal(t, "w2", ls2.Owner)
}

func TestLeaseExpires(t *testing.T) {
	t.Parallel()
	_, l := openLeases(t)
	ctx := t.Context()
	before := time.Now()
	_, err := l.Acquire(ctx, "run_l", "w1")
	require.NoError(t, err)

	ls := acquireWhenFree(t, l, "run_l", "w2", leaseTTL+2*time.Second)
	took := time.Since(before)
	require.GreaterOrEqual(t, took, leaseTTL-100*time.Millisecond, "expired before its TTL")
	require.Less(t, took, leaseTTL+2*time.Second)
	t.Logf("lease free after %v (TTL %v)", took, leaseTTL)
	requireHeldBy(t, l, "run_l", "w2")
	require.Equal(t, "w2", ls.Owner)
}

func TestLeaseRenewLost(t *testing.T) {
	t.Parallel()
	_, l := openLeases(t)
	ctx := t.Context()

	// Taken over by another owner after it expired.
	ls, err := l.Acquire(ctx, "run_taken", "w1")
	require.NoError(t, err)
	acquireWhenFree(t, l, "run_taken", "w2", leaseTTL+2*time.Second)
	err = l.Renew(ctx, ls)
	require.ErrorIs(t, err, eventstore.ErrLeaseLost)
	require.Contains(t, err.Error(), "run_taken")
	requireHeldBy(t, l, "run_taken", "w2")

	// Expired with no new owner.
	ls, err = l.Acquire(ctx, "run_expired", "w1")
	require.NoError(t, err)
	require.NoError(t, l.WaitFree(timeout(t, leaseTTL+2*time.Second), "run_expired"))
	require.ErrorIs(t, l.Renew(ctx, ls), eventstore.ErrLeaseLost)
	holder, err := l.Holder(ctx, "run_expired")
	require.NoError(t, err)
	require.Empty(t, holder, "a failed renewal must not bring the lease back")

	// Released by its owner.
	ls, err = l.Acquire(ctx, "run_released", "w1")
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx, ls))
	require.ErrorIs(t, l.Renew(ctx, ls), eventstore.ErrLeaseLost)
}

func TestLeaseRelease(t *testing.T) {
	t.Parallel()
	_, l := openLeases(t)
	ctx := t.Context()
	ls, err := l.Acquire(ctx, "run_l", "w1")
	require.NoError(t, err)
	require.NoError(t, l.Renew(ctx, ls))
	require.NoError(t, l.Release(ctx, ls))

	holder, err := l.Holder(ctx, "run_l")
	require.NoError(t, err)
	require.Empty(t, holder)
	// Free at once: no waiting for the TTL.
	ls2, err := l.Acquire(ctx, "run_l", "w2")
	require.NoError(t, err)
	requireHeldBy(t, l, "run_l", "w2")

	// Releasing again, or releasing a lease someone else now holds, is not
	// an error and leaves the new owner's lease alone.
	require.NoError(t, l.Release(ctx, ls))
	requireHeldBy(t, l, "run_l", "w2")
	require.NoError(t, l.Renew(ctx, ls2), "the new owner's lease is intact")
	require.NoError(t, l.Release(ctx, ls2))
	require.NoError(t, l.Release(ctx, ls2))
	holder, err = l.Holder(ctx, "run_l")
	require.NoError(t, err)
	require.Empty(t, holder)
}

func TestLeaseReleaseLost(t *testing.T) {
	t.Parallel()
	_, l := openLeases(t)
	ctx := t.Context()
	ls, err := l.Acquire(ctx, "run_l", "w1")
	require.NoError(t, err)
	acquireWhenFree(t, l, "run_l", "w2", leaseTTL+2*time.Second)

	require.NoError(t, l.Release(ctx, ls), "releasing a lost lease is not an error")
	requireHeldBy(t, l, "run_l", "w2")
}

func TestLeaseWaitFree(t *testing.T) {
	t.Parallel()
	_, l := openLeases(t)
	ctx := t.Context()

	// Free already: returns at once.
	require.NoError(t, l.WaitFree(timeout(t, 5*time.Second), "run_never"))

	// Released while waiting.
	ls, err := l.Acquire(ctx, "run_rel", "w1")
	require.NoError(t, err)
	done := make(chan error, 1)
	waiting := time.Now()
	go func() { done <- l.WaitFree(timeout(t, 10*time.Second), "run_rel") }()
	select {
	case err := <-done:
		require.FailNow(t, "WaitFree returned while the lease was held", "err: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	require.NoError(t, l.Release(ctx, ls))
	select {
	case err := <-done:
		require.NoError(t, err)
		require.Less(t, time.Since(waiting), leaseTTL, "a release frees the lease before its TTL")
	case <-time.After(5 * time.Second):
		require.FailNow(t, "WaitFree did not see the release")
	}
	// Released before the wait: returns at once.
	require.NoError(t, l.WaitFree(timeout(t, 5*time.Second), "run_rel"))

	// Expired while waiting.
	before := time.Now()
	_, err = l.Acquire(ctx, "run_exp", "w1")
	require.NoError(t, err)
	require.NoError(t, l.WaitFree(timeout(t, leaseTTL+2*time.Second), "run_exp"))
	require.GreaterOrEqual(t, time.Since(before), leaseTTL-100*time.Millisecond)
	_, err = l.Acquire(ctx, "run_exp", "w2")
	require.NoError(t, err, "free when WaitFree says so")

	// Held and renewed: WaitFree ends with its context.
	ls, err = l.Acquire(ctx, "run_kept", "w1")
	require.NoError(t, err)
	wctx, cancel := context.WithTimeout(ctx, 2*leaseTTL)
	defer cancel()
	go func() { done <- l.WaitFree(wctx, "run_kept") }()
	tick := time.NewTicker(leaseTTL / 3)
	defer tick.Stop()
	var werr error
renewing:
	for {
		select {
		case <-tick.C:
			require.NoError(t, l.Renew(ctx, ls))
		case werr = <-done:
			break renewing
		}
	}
	require.ErrorIs(t, werr, context.DeadlineExceeded)
	requireHeldBy(t, l, "run_kept", "w1")

	// Canceled.
	cctx, ccancel := context.WithCancel(ctx)
	go func() { done <- l.WaitFree(cctx, "run_kept") }()
	ccancel()
	select {
	case err := <-done:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(5 * time.Second):
		require.FailNow(t, "WaitFree ignored its context")
	}
}

// TestLeaseValid checks that a lease stops being Valid before the server
// can have expired it: a writer that checks Valid before each append never
// appends with a lease another worker may already hold.
func TestLeaseValid(t *testing.T) {
	t.Parallel()
	_, l := openLeases(t)
	ctx := t.Context()
	before := time.Now()
	ls, err := l.Acquire(ctx, "run_l", "w1")
	require.NoError(t, err)
	after := time.Now()

	require.True(t, ls.Valid(after))
	// The server's TTL runs from when it stored the lease, after before;
	// Valid gives up a margin earlier than that, measured from after.
	require.False(t, ls.Valid(after.Add(leaseTTL)), "valid at the TTL")
	require.False(t, ls.Valid(after.Add(leaseTTL*4/5)), "valid without a safety margin")
	require.True(t, ls.Valid(before.Add(leaseTTL/2)))

	// In real time: once Valid turns false the server still holds the lease.
	eventually(t, 2*leaseTTL, 5*time.Millisecond, func() bool { return !ls.Valid(time.Now()) }, "lease never turned invalid")
	holder, err := l.Holder(ctx, "run_l")
	require.NoError(t, err)
	if time.Since(before) < leaseTTL {
		require.Equal(t, "w1", holder, "the server expired the lease before Valid turned false")
	} else {
		// This machine was too slow to tell; the checks above still hold.
		t.Logf("Holder answered %v after Acquire, past the TTL", time.Since(before))
	}

	// A renewal makes it valid again, measured from the renewal.
	fresh, err := l.Acquire(ctx, "run_r", "w1")
	require.NoError(t, err)
	renewed := time.Now()
	require.NoError(t, l.Renew(ctx, fresh))
	require.True(t, fresh.Valid(time.Now()))
	require.True(t, fresh.Valid(renewed.Add(leaseTTL/2)))
	require.False(t, fresh.Valid(time.Now().Add(leaseTTL)))
}

// TestLeaseWaitFreeConnClosed: a watch that ends because the connection
// closed says nothing about the lease, so WaitFree must not report it free.
func TestLeaseWaitFreeConnClosed(t *testing.T) {
	t.Parallel()
	b, l := openLeases(t)
	ls, err := l.Acquire(t.Context(), "run_l", "w1")
	require.NoError(t, err)

	nc := b.srv.Conn(t)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	waiter, err := eventstore.OpenLeases(t.Context(), js, leaseTTL)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- waiter.WaitFree(timeout(t, 20*time.Second), "run_l") }()
	select {
	case err := <-done:
		require.FailNow(t, "WaitFree returned while the lease was held", "err: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	nc.Close()
	select {
	case err := <-done:
		require.Error(t, err, "the lease is still held")
	case <-time.After(10 * time.Second):
		require.FailNow(t, "WaitFree did not return after its connection closed")
	}
	require.NoError(t, l.Renew(t.Context(), ls))
	requireHeldBy(t, l, "run_l", "w1")
}

// TestLeaseRenewLostAck re-sends a renewal whose first try landed but whose
// acknowledgement was lost (the first try is published here by hand, as
// Renew publishes it). The lease is still ours: Renew must not report it
// lost.
func TestLeaseRenewLostAck(t *testing.T) {
	t.Parallel()
	b, l := openLeases(t)
	ctx := t.Context()
	ls, err := l.Acquire(ctx, "run_l", "w1")
	require.NoError(t, err)

	_, err = b.js.PublishMsg(ctx, &nats.Msg{Subject: "$KV." + eventstore.LeaseBucket + ".run_l", Data: []byte("w1")},
		jetstream.WithExpectStream("KV_"+eventstore.LeaseBucket),
		jetstream.WithExpectLastSequencePerSubject(ls.Revision),
		jetstream.WithMsgTTL(leaseTTL))
	require.NoError(t, err)

	rev := ls.Revision
	require.NoError(t, l.Renew(ctx, ls), "the landed renewal was ours")
	require.Greater(t, ls.Revision, rev+1, "renewed again after the landed try")
	require.True(t, ls.Valid(time.Now()))
	requireHeldBy(t, l, "run_l", "w1")
	require.NoError(t, l.Renew(ctx, ls))

	// A lease another owner created after expiry is not mistaken for ours,
	// nor is one the same owner acquired afresh.
	for _, owner := range []string{"w2", "w1"} {
		old, err := l.Acquire(ctx, "run_"+owner, "w1")
		require.NoError(t, err)
		acquireWhenFree(t, l, "run_"+owner, owner, leaseTTL+2*time.Second)
		require.ErrorIs(t, l.Renew(ctx, old), eventstore.ErrLeaseLost, "new owner %s", owner)
	}
}

func TestLeaseBreak(t *testing.T) {
	t.Parallel()
	_, l := openLeases(t)
	ctx := t.Context()
	holder, err := l.Break(ctx, "run_b")
	require.NoError(t, err)
	require.Empty(t, holder, "breaking a free lease breaks nothing")

	ls, err := l.Acquire(ctx, "run_b", "frozen")
	require.NoError(t, err)
	holder, err = l.Break(ctx, "run_b")
	require.NoError(t, err)
	require.Equal(t, "frozen", holder)
	// Free at once, and the old holder cannot renew it.
	ls2, err := l.Acquire(ctx, "run_b", "w2")
	require.NoError(t, err)
	require.ErrorIs(t, l.Renew(ctx, ls), eventstore.ErrLeaseLost)
	require.NoError(t, l.Release(ctx, ls), "the old holder's release leaves the new lease alone")
	requireHeldBy(t, l, "run_b", "w2")
	require.NoError(t, l.Renew(ctx, ls2))
}

// TestLeaseForeignValueBroken: a value on a run's lease key that PAL did
// not write (no TTL, not an owner string, a stored answer) is broken by
// the next Acquire, which takes the lease, and logged; a worker's lease
// (and a renewed one) is not.
func TestLeaseForeignValueBroken(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{LeaseTTL: leaseTTL})
	var logged bytes.Buffer
	l, err := eventstore.OpenLeases(t.Context(), b.js, leaseTTL,
		eventstore.WithLeaseLogger(slog.New(slog.NewTextHandler(&logged, nil))))
	require.NoError(t, err)
	ctx := t.Context()
	subj := func(run string) string { return "$KV." + eventstore.LeaseBucket + "." + run }
	for _, tc := range []struct {
		run, reason string
		forge       func(run string)
	}{
		{"run_nottl", "no TTL", func(run string) {
			// A worker's value, but without a TTL: it would never expire.
			_, err := b.js.Publish(ctx, subj(run), []byte("w9/0badc0de"))
			require.NoError(t, err)
		}},
		{"run_json", "not a worker's owner string", func(run string) {
			_, err := b.js.PublishMsg(ctx, &nats.Msg{Subject: subj(run), Data: []byte(`{"stream":"PAL_CMDS","seq":7}`)}, jetstream.WithMsgTTL(time.Hour))
			require.NoError(t, err)
		}},
		{"run_answer", "a stored answer", func(run string) {
			ls, err := l.Acquire(ctx, "run_src", "w1/00000001")
			require.NoError(t, err)
			req := fmt.Appendf(nil, `{"seq":%d}`, ls.Revision)
			require.NoError(t, b.nc.PublishRequest("$JS.API.DIRECT.GET.KV_"+eventstore.LeaseBucket, subj(run), req))
			eventually(t, 10*time.Second, 10*time.Millisecond, func() bool {
				h, err := l.Holder(ctx, run)
				return err == nil && h != ""
			}, "the answer never landed on the key")
		}},
	} {
		tc.forge(tc.run)
		ls, err := l.Acquire(ctx, tc.run, "w2/00000002")
		require.NoError(t, err, "%s: the foreign value is broken and the lease taken", tc.run)
		require.Equal(t, "w2/00000002", ls.Owner)
		requireHeldBy(t, l, tc.run, "w2/00000002")
		require.Contains(t, logged.String(), "run_id="+tc.run)
		require.Contains(t, logged.String(), tc.reason)
	}
	// A worker's lease, renewed, is honoured.
	ls, err := l.Acquire(ctx, "run_ok", "w1/00000001")
	require.NoError(t, err)
	require.NoError(t, l.Renew(ctx, ls))
	requireHeldBy(t, l, "run_ok", "w1/00000001")
	require.NotContains(t, logged.String(), "run_ok")
}
