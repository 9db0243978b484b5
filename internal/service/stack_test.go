package service_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/palrun/pal/internal/service"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recorder is a set of services that write what they do to one log.
type recorder struct {
	mu  sync.Mutex
	log []string
}

func (r *recorder) note(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.log = append(r.log, s)
}

func (r *recorder) lines() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.log...)
}

// svc is a service named name; its start fails with startErr and its stop
// with stopErr. Its stop notes whether its context had ended.
func (r *recorder) svc(name string, startErr, stopErr error) service.Service {
	return service.Func{
		OnStart: func(context.Context) error {
			r.note("start " + name)
			return startErr
		},
		OnStop: func(ctx context.Context) error {
			if ctx.Err() != nil {
				r.note("stop " + name + " (ctx ended)")
			} else {
				r.note("stop " + name)
			}
			return stopErr
		},
	}
}

func TestStackStopsInReverse(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var r recorder
	var st service.Stack
	require.NoError(t, st.Start(ctx, "nats", r.svc("nats", nil, nil)))
	st.Started("pool", func(context.Context) error { r.note("close pool"); return nil })
	require.NoError(t, st.Start(ctx, "worker", r.svc("worker", nil, nil)))
	require.NoError(t, st.Start(ctx, "api", r.svc("api", nil, nil)))
	require.NoError(t, st.Stop(ctx))
	require.Equal(t, []string{"start nats", "start worker", "start api", "stop api", "stop worker", "close pool", "stop nats"}, r.lines())

	// Each part stops once: a second Stop does nothing.
	require.NoError(t, st.Stop(ctx))
	require.Len(t, r.lines(), 7)
}

// TestStackFailedStart: a start that fails stops, newest first, every
// service started before it, and the service that failed is not stopped
// (it never ran). The error names it; nothing is left to stop.
func TestStackFailedStart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var r recorder
	var st service.Stack
	require.NoError(t, st.Start(ctx, "worker", r.svc("worker", nil, nil)))
	require.NoError(t, st.Start(ctx, "commands", r.svc("commands", nil, nil)))
	require.NoError(t, st.Start(ctx, "service", r.svc("service", nil, nil)))
	errSweep := errors.New("no leases bucket")
	err := st.Start(ctx, "sweep", r.svc("sweep", errSweep, nil))
	require.ErrorIs(t, err, errSweep)
	require.EqualError(t, err, "starting sweep: no leases bucket")
	require.Equal(t, []string{"start worker", "start commands", "start service", "start sweep",
		"stop service", "stop commands", "stop worker"}, r.lines())

	require.NoError(t, st.Stop(ctx), "nothing is left to stop")
	require.Len(t, r.lines(), 7)
}

// TestStackFailedStartAfterCancel: a start that fails because the process
// is stopping (its ctx ended) still stops what started before it, with a
// context of its own.
func TestStackFailedStartAfterCancel(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	var r recorder
	var st service.Stack
	require.NoError(t, st.Start(ctx, "nats", r.svc("nats", nil, nil)))
	cancel()
	err := st.Start(ctx, "worker", r.svc("worker", ctx.Err(), nil))
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, []string{"start nats", "start worker", "stop nats"}, r.lines())
}

// TestStackStopErrors: every part is stopped even when one fails to, and
// every failure is returned, named.
func TestStackStopErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var r recorder
	var st service.Stack
	errA, errC := errors.New("a is stuck"), errors.New("c is stuck")
	require.NoError(t, st.Start(ctx, "a", r.svc("a", nil, errA)))
	require.NoError(t, st.Start(ctx, "b", r.svc("b", nil, nil)))
	require.NoError(t, st.Start(ctx, "c", r.svc("c", nil, errC)))
	err := st.Stop(ctx)
	require.ErrorIs(t, err, errA)
	require.ErrorIs(t, err, errC)
	require.EqualError(t, err, "stopping c: c is stuck\nstopping a: a is stuck")
	require.Equal(t, []string{"start a", "start b", "start c", "stop c", "stop b", "stop a"}, r.lines())

	// A failed start returns the stop errors of the unwinding too.
	var r2 recorder
	var st2 service.Stack
	require.NoError(t, st2.Start(ctx, "a", r2.svc("a", nil, errA)))
	err = st2.Start(ctx, "b", r2.svc("b", errC, nil))
	require.EqualError(t, err, "starting b: c is stuck\nstopping a: a is stuck")
}

func TestCloser(t *testing.T) {
	t.Parallel()
	closed := 0
	var st service.Stack
	st.Started("conn", service.Closer(func() { closed++ }))
	require.NoError(t, st.Stop(context.Background()))
	require.Equal(t, 1, closed)
}

func Example() {
	ctx := context.Background()
	part := func(name string, fail bool) service.Service {
		return service.Func{
			OnStart: func(context.Context) error {
				fmt.Println("start", name)
				if fail {
					return errors.New("address in use")
				}
				return nil
			},
			OnStop: func(context.Context) error { fmt.Println("stop", name); return nil },
		}
	}
	var st service.Stack
	for _, name := range []string{"worker", "commands", "api"} {
		if err := st.Start(ctx, name, part(name, name == "api")); err != nil {
			fmt.Println(err)
			return
		}
	}
	// Output:
	// start worker
	// start commands
	// start api
	// stop commands
	// stop worker
	// starting api: address in use
}
