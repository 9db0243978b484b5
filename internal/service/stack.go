// Package service composes a process's long-running parts. A Stack starts
// them in order and stops them in reverse: what started last may use what
// started before it, so it stops first. The pal commands (pal dev, pal
// worker, pal server, pal projector), the bench and the test stack compose
// their parts on one.
//
// Invariants:
//
//   - A start that fails stops, newest first, everything started before
//     it, so a process that cannot come up leaves nothing running behind
//     its error.
//   - Stop stops each part once, newest first, each after the one above it
//     has returned, and is safe to call again (it then does nothing).
//   - A part that is running already when it joins (a connection, a pool,
//     a temporary directory) joins with Started and is stopped in its turn.
package service

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Service is a long-running part: Start returns once it runs, Stop ends it
// and waits for its goroutines, or until ctx ends. The workers, the
// projector, the command processor and the HTTP server are Services.
type Service interface {
	Start(ctx context.Context) error
	Stop(ctx context.Context) error
}

// Func is a Service made of two functions; a nil one does nothing.
type Func struct {
	OnStart func(ctx context.Context) error
	OnStop  func(ctx context.Context) error
}

// Start calls OnStart.
func (f Func) Start(ctx context.Context) error {
	if f.OnStart == nil {
		return nil
	}
	return f.OnStart(ctx)
}

// Stop calls OnStop.
func (f Func) Stop(ctx context.Context) error {
	if f.OnStop == nil {
		return nil
	}
	return f.OnStop(ctx)
}

// UnwindTimeout bounds how long a failed Start waits for the parts started
// before it to stop.
const UnwindTimeout = 30 * time.Second

// Stack starts services in order and stops them in reverse. The zero
// Stack is empty and ready to use; it is safe for concurrent use.
type Stack struct {
	mu      sync.Mutex
	started []part
}

// part is a started service with its name for errors.
type part struct {
	name string
	stop func(ctx context.Context) error
}

// Start starts svc on top of the stack; name says what it is in errors.
// When the start fails, Start stops everything started before it, newest
// first (within UnwindTimeout, even if ctx has ended), and returns
// "starting <name>: <err>" joined with their stop errors: the stack is
// then empty.
func (s *Stack) Start(ctx context.Context, name string, svc Service) error {
	if err := svc.Start(ctx); err != nil {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), UnwindTimeout)
		defer cancel()
		return errors.Join(fmt.Errorf("starting %s: %w", name, err), s.Stop(uctx))
	}
	s.Started(name, svc.Stop)
	return nil
}

// Started puts a part that runs already on top of the stack: stop is
// called in its turn, as a started service's Stop.
func (s *Stack) Started(name string, stop func(ctx context.Context) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.started = append(s.started, part{name: name, stop: stop})
}

// Stop stops every part, newest first, each once, and returns their
// errors joined, each as "stopping <name>: <err>". Each stop gets ctx, so
// a deadline on it bounds them all.
func (s *Stack) Stop(ctx context.Context) error {
	s.mu.Lock()
	parts := s.started
	s.started = nil
	s.mu.Unlock()
	var errs []error
	for i := len(parts) - 1; i >= 0; i-- {
		if err := parts[i].stop(ctx); err != nil {
			errs = append(errs, fmt.Errorf("stopping %s: %w", parts[i].name, err))
		}
	}
	return errors.Join(errs...)
}

// Closer is the stop of a part that ends with a plain close (a
// connection's, a pool's), for Started.
func Closer(close func()) func(ctx context.Context) error {
	return func(context.Context) error {
		close()
		return nil
	}
}
