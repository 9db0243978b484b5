package providertest

import (
	"context"
	"errors"
	"slices"
	"sync"
)

// ErrReleased is returned by Hold.Wait when the hold was released and no
// arrival is left to report.
var ErrReleased = errors.New("providertest: hold released")

// Hold keeps matching requests waiting (the client sees no answer) until
// Release. It is how a test catches a call in flight, e.g. to kill the
// worker that made it.
type Hold struct {
	s     *Server
	match func(Call) bool
	// after, when > 0, holds a streamed answer once that many deltas are
	// out (HoldAfter); a request that is not streamed is held before it
	// is answered.
	after int

	mu       sync.Mutex
	queue    []Call        // arrivals not yet reported by Wait
	notify   chan struct{} // closed and replaced at each arrival
	released chan struct{}
	once     sync.Once
}

// Hold makes the requests that match (nil matches all) wait until the hold
// is released, the client goes away or the server closes; a held request
// that the client abandons gets no answer. A request that matches several
// holds waits for all of them. match is called with the server's lock held:
// it must not call the Server's methods.
func (s *Server) Hold(match func(Call) bool) *Hold { return s.addHold(match, 0) }

func (s *Server) addHold(match func(Call) bool, after int) *Hold {
	h := &Hold{s: s, match: match, after: after, notify: make(chan struct{}), released: make(chan struct{})}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.holds = append(s.holds, h)
	return h
}

// HoldAfter is Hold for a streamed answer's middle: a matching request
// that asked for a stream gets its first deltas deltas (words of text or
// thinking), then waits, its connection open, until the hold is released
// (then the stream goes on), the client goes away or the server closes.
// Wait reports the request when it stops there. deltas ≤ 0 is Hold.
func (s *Server) HoldAfter(match func(Call) bool, deltas int) *Hold {
	return s.addHold(match, max(deltas, 0))
}

// Wait returns the next matching request that arrived and has not been
// returned by Wait before, waiting for one if need be. It returns ctx's
// error when ctx ends first, ErrReleased once the hold is released and every
// arrival has been reported, and ErrClosed once the server is closed.
func (h *Hold) Wait(ctx context.Context) (Call, error) {
	for {
		h.mu.Lock()
		if len(h.queue) > 0 {
			c := h.queue[0]
			h.queue = h.queue[1:]
			h.mu.Unlock()
			return c, nil
		}
		notify := h.notify
		h.mu.Unlock()
		select {
		case <-h.released:
			h.mu.Lock()
			empty := len(h.queue) == 0
			h.mu.Unlock()
			if empty {
				return Call{}, ErrReleased
			}
		case <-notify:
		case <-h.s.closing:
			return Call{}, ErrClosed
		case <-ctx.Done():
			return Call{}, ctx.Err()
		}
	}
}

// Release lets the held requests through, and every later matching request
// too: a released hold holds nothing. It is idempotent.
func (h *Hold) Release() {
	h.once.Do(func() {
		close(h.released)
		h.s.mu.Lock()
		defer h.s.mu.Unlock()
		h.s.holds = slices.DeleteFunc(h.s.holds, func(o *Hold) bool { return o == h })
	})
}

// matches reports whether h holds c. h.s.mu is held.
func (h *Hold) matches(c Call) bool {
	select {
	case <-h.released:
		return false
	default:
	}
	return h.match == nil || h.match(c)
}

// hold queues c as an arrival and waits until h is released (true), or the
// client goes away or the server closes (false).
func (h *Hold) hold(ctx context.Context, closing <-chan struct{}, c Call) bool {
	h.mu.Lock()
	h.queue = append(h.queue, c)
	close(h.notify)
	h.notify = make(chan struct{})
	h.mu.Unlock()
	select {
	case <-h.released:
		return true
	case <-closing:
		return false
	case <-ctx.Done():
		return false
	}
}
