package retry_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/palrun/pal/internal/retry"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fast is a policy without jitter, so its waits can be checked exactly.
var fast = retry.Policy{Initial: time.Millisecond, Max: 4 * time.Millisecond}

var errFlaky = errors.New("flaky")

type try struct {
	attempt int
	wait    time.Duration
}

func TestDoRetriesUntilSuccess(t *testing.T) {
	t.Parallel()
	calls := 0
	var tries []try
	err := retry.Do(context.Background(), fast, func() error {
		calls++
		if calls < 5 {
			return errFlaky
		}
		return nil
	}, retry.OnRetry(func(err error, attempt int, wait time.Duration) {
		require.ErrorIs(t, err, errFlaky)
		tries = append(tries, try{attempt, wait})
	}))
	require.NoError(t, err)
	require.Equal(t, 5, calls)
	// Multiplier 0 doubles; Max caps.
	require.Equal(t, []try{{1, time.Millisecond}, {2, 2 * time.Millisecond}, {3, 4 * time.Millisecond}, {4, 4 * time.Millisecond}}, tries)
}

func TestValueReturnsTheSucceedingTry(t *testing.T) {
	t.Parallel()
	calls := 0
	v, err := retry.Value(context.Background(), fast, func() (int, error) {
		calls++
		if calls < 3 {
			return -1, errFlaky
		}
		return calls * 10, nil
	})
	require.NoError(t, err)
	require.Equal(t, 30, v)
}

func TestPermanentStopsAtOnce(t *testing.T) {
	t.Parallel()
	errBad := errors.New("bad credentials")
	calls, notified := 0, 0
	err := retry.Do(context.Background(), fast, func() error {
		calls++
		if calls == 1 {
			return errFlaky
		}
		return retry.Permanent(errBad)
	}, retry.OnRetry(func(error, int, time.Duration) { notified++ }))
	require.Equal(t, 2, calls)
	require.Equal(t, 1, notified, "the permanent failure is not announced as a retry")
	require.Same(t, errBad, err, "the permanent error comes back as the operation made it")
	var pe *backoff.PermanentError
	require.False(t, errors.As(err, &pe))
	require.NoError(t, retry.Permanent(nil))
}

func TestDoStopsMidWaitWhenContextEnds(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	slow := retry.Policy{Initial: time.Hour, Max: time.Hour}
	calls := 0
	start := time.Now()
	err := retry.Do(ctx, slow, func() error {
		calls++
		return errFlaky
	}, retry.OnRetry(func(_ error, _ int, wait time.Duration) {
		require.Equal(t, time.Hour, wait)
		cancel() // Do is about to wait an hour
	}))
	require.Less(t, time.Since(start), time.Minute, "Do did not wait out the hour")
	require.Equal(t, 1, calls)
	require.ErrorIs(t, err, context.Canceled)
	require.EqualError(t, err, "context canceled (last error: flaky)")
}

func TestDoRunsOnceWhenContextHasEnded(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	calls := 0
	err := retry.Do(ctx, fast, func() error {
		calls++
		return ctx.Err()
	})
	require.Equal(t, 1, calls)
	require.EqualError(t, err, "context canceled", "no last error that repeats ctx's")

	calls = 0
	require.NoError(t, retry.Do(ctx, fast, func() error { calls++; return nil }))
	require.Equal(t, 1, calls)
}

func TestRestartBeginsTheBackoffAgain(t *testing.T) {
	t.Parallel()
	calls := 0
	var tries []try
	err := retry.Do(context.Background(), fast, func() error {
		calls++
		if calls < 6 {
			return errFlaky
		}
		return nil
	}, retry.Restart(func() bool { return calls == 3 }), retry.OnRetry(func(_ error, attempt int, wait time.Duration) {
		tries = append(tries, try{attempt, wait})
	}))
	require.NoError(t, err)
	require.Equal(t, []try{
		{1, time.Millisecond}, {2, 2 * time.Millisecond},
		{1, time.Millisecond}, // the third try made progress
		{2, 2 * time.Millisecond}, {3, 4 * time.Millisecond},
	}, tries)
}

func TestPolicyBackOff(t *testing.T) {
	t.Parallel()
	// backoff's own default gives up after 15 minutes; a policy never does.
	bo := retry.Policy{Initial: time.Millisecond, Max: time.Second, Multiplier: 1.5, Jitter: 0.5}.NewBackOff()
	require.Zero(t, bo.MaxElapsedTime)
	for range 1000 {
		d := bo.NextBackOff()
		require.NotEqual(t, backoff.Stop, d)
		require.LessOrEqual(t, d, 1500*time.Millisecond, "Max plus half of it at most")
		require.GreaterOrEqual(t, d, 500*time.Microsecond)
	}
	require.Equal(t, 1.5, bo.Multiplier)
	require.Equal(t, 0.5, bo.RandomizationFactor)
}

// TestPolicyWait: the n-th wait is the one Do would wait after the n-th
// failed try, without jitter: a try count is all it takes.
func TestPolicyWait(t *testing.T) {
	t.Parallel()
	p := retry.Policy{Initial: 20 * time.Millisecond, Max: time.Second, Jitter: 0.5}
	var got []time.Duration
	for n := 1; n <= 8; n++ {
		got = append(got, p.Wait(n))
	}
	ms := time.Millisecond
	require.Equal(t, []time.Duration{20 * ms, 40 * ms, 80 * ms, 160 * ms, 320 * ms, 640 * ms, time.Second, time.Second}, got)
	var tries []time.Duration
	err := retry.Do(context.Background(), retry.Policy{Initial: time.Millisecond, Max: 4 * time.Millisecond}, func() error {
		if len(tries) < 4 {
			return errFlaky
		}
		return nil
	}, retry.OnRetry(func(_ error, attempt int, wait time.Duration) {
		require.Equal(t, fast.Wait(attempt), wait, "try %d", attempt)
		tries = append(tries, wait)
	}))
	require.NoError(t, err)
	require.Len(t, tries, 4)
}

func TestDoKeepsALastErrorThatWrapsTheContexts(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	err := retry.Do(ctx, fast, func() error {
		cancel()
		return fmt.Errorf("reading run r: %w", ctx.Err())
	})
	require.ErrorIs(t, err, context.Canceled)
	require.EqualError(t, err, "reading run r: context canceled", "the operation's own words, not a bare ctx.Err()")
}
