// Package retry is PAL's one way to try an operation again: an exponential
// backoff (github.com/cenkalti/backoff/v4) that stops when its context
// ends. Every loop in PAL that waits and tries again goes through Do, so
// the rules live here once:
//
//   - The operation says which failures are permanent by wrapping them in
//     Permanent; every other error is retried. Do returns a permanent
//     error unwrapped, as the operation made it.
//   - When ctx ends, Do stops at once (mid-wait too) and returns an error
//     that wraps ctx.Err() and names the last failure.
//   - A policy never gives up on its own: a caller that wants a limit
//     counts tries or time in its operation and returns Permanent.
//   - Where another system keeps the wait (a message handed back to
//     JetStream with a delay, as a start's work that came before its
//     run_created is), Policy.Wait gives the n-th wait and Do is not used.
//
// The journaled retries of a step (step_retrying, a durable timer) are
// not this: they survive a crash, so they live in the journal.
package retry

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// Policy is an exponential backoff: the first wait is Initial, each next
// one Multiplier times longer up to Max, and each is spread by ±Jitter
// (0.5: anywhere from half to one and a half times the nominal wait) so
// that processes failing together do not retry together.
type Policy struct {
	Initial time.Duration
	Max     time.Duration
	// Multiplier is the growth per try; 0 means 2.
	Multiplier float64
	// Jitter is the randomization factor, from 0 (none) to 1.
	Jitter float64
}

// NewBackOff returns a fresh backoff that follows p and never stops on its
// own.
func (p Policy) NewBackOff() *backoff.ExponentialBackOff {
	m := p.Multiplier
	if m == 0 {
		m = 2
	}
	return backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(p.Initial),
		backoff.WithMaxInterval(p.Max),
		backoff.WithMultiplier(m),
		backoff.WithRandomizationFactor(p.Jitter),
		backoff.WithMaxElapsedTime(0),
	)
}

// Wait returns the wait p sets after the n-th failed try (n from 1), with
// no jitter: for tries whose waits another system keeps, such as a
// message handed back to JetStream with a delay, where Do cannot wait.
func (p Policy) Wait(n int) time.Duration {
	p.Jitter = 0
	bo := p.NewBackOff()
	wait := bo.NextBackOff()
	for range n - 1 {
		wait = bo.NextBackOff()
	}
	return wait
}

// Permanent marks err as not worth retrying: Do returns err at once.
// Permanent(nil) is nil.
func Permanent(err error) error { return backoff.Permanent(err) }

// An Option changes one call of Do.
type Option func(*options)

type options struct {
	onRetry  func(err error, attempt int, wait time.Duration)
	progress func() bool
}

// OnRetry calls f after each failed try that will be retried, with the
// error, the number of the try that failed (from 1) and the wait before
// the next. It is not called for the failure that ends Do.
func OnRetry(f func(err error, attempt int, wait time.Duration)) Option {
	return func(o *options) { o.onRetry = f }
}

// Restart asks, after each failed try, whether that try made progress (a
// watch that delivered events before it broke). If it did, the backoff
// and the try count start again from the beginning: the next wait is
// Initial again.
func Restart(progressed func() bool) Option {
	return func(o *options) { o.progress = progressed }
}

// Do calls op until it returns nil, returns an error wrapped in
// Permanent, or ctx ends, waiting between tries as p says. op runs at
// least once, even when ctx has already ended. It returns nil, the
// permanent error, or (ctx ended) an error that wraps ctx.Err() and says
// what the last failure was. An operation's errors should name the action
// and its subject ("appending to run x: …"), since the last one is all a
// caller learns of a wait that ctx cut short.
func Do(ctx context.Context, p Policy, op func() error, opts ...Option) error {
	_, err := Value(ctx, p, func() (struct{}, error) { return struct{}{}, op() }, opts...)
	return err
}

// Value is Do for an operation that returns a value: it returns the value
// of the try that succeeded.
func Value[T any](ctx context.Context, p Policy, op func() (T, error), opts ...Option) (T, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	bo := p.NewBackOff()
	attempt := 0
	var last error
	v, err := backoff.RetryNotifyWithData(func() (T, error) {
		attempt++
		v, err := op()
		if err != nil {
			last = err
			if o.progress != nil && o.progress() {
				bo.Reset()
				attempt = 1
			}
		}
		return v, err
	}, backoff.WithContext(bo, ctx), func(err error, wait time.Duration) {
		if o.onRetry != nil {
			o.onRetry(err, attempt, wait)
		}
	})
	if cerr := ctx.Err(); err != nil && cerr != nil && errors.Is(err, cerr) && last != nil {
		// backoff reports only ctx.Err(); keep the failure that was
		// being waited out, it is what an operator needs.
		if errors.Is(last, cerr) {
			return v, last
		}
		return v, fmt.Errorf("%w (last error: %v)", err, last)
	}
	return v, err
}
