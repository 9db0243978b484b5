package limit

import (
	"errors"
	"fmt"
	"sync"
	"time"
)

// Kind is what a request asks of PAL, each kind with its own rate.
type Kind int

const (
	// Start makes a run: start, fork, retry.
	Start Kind = iota
	// Command is an input to a run: approve, cancel, budget, signal,
	// resume.
	Command
	// Stream opens an event stream (SSE or gRPC).
	Stream
	numKinds
)

// what names a kind's requests in errors.
func (k Kind) what() string {
	switch k {
	case Start:
		return "runs started (start, fork, retry)"
	case Command:
		return "commands (approve, cancel, budget, signal, resume)"
	default:
		return "event streams opened"
	}
}

// Limits are what one identity may ask of PAL.
type Limits struct {
	// Starts, Commands and Streams are the rates of each Kind.
	Starts, Commands, Streams Rate
	// OpenStreams caps the event streams one identity holds open at once
	// (0: no cap).
	OpenStreams int
}

// Defaults are the limits of a PAL that sets none: far above what a
// person or a script does (a CI job starting a few hundred runs, a
// dashboard following a few hundred), well below what exhausts a server.
func Defaults() Limits {
	return Limits{
		Starts:      Rate{N: 50, Per: time.Second, Burst: 500},
		Commands:    Rate{N: 100, Per: time.Second, Burst: 1000},
		Streams:     Rate{N: 50, Per: time.Second, Burst: 500},
		OpenStreams: 1000,
	}
}

// Limiter holds the Limits of every identity: a token bucket per
// identity and Kind, and a count of each identity's open streams. REST,
// gRPC, the NATS service and the durable command processor share one per
// process, so a limit holds whichever door a caller comes in by. A nil
// *Limiter allows everything.
type Limiter struct {
	limits Limits
	rates  [numKinds]*Buckets

	mu   sync.Mutex
	open map[string]int
}

// New returns a Limiter of l; now is the clock (time.Now when nil).
func New(l Limits, now func() time.Time) *Limiter {
	lim := &Limiter{limits: l, open: map[string]int{}}
	for k, r := range [numKinds]Rate{Start: l.Starts, Command: l.Commands, Stream: l.Streams} {
		lim.rates[k] = NewBuckets(r, now)
	}
	return lim
}

// Limits returns what l allows.
func (l *Limiter) Limits() Limits {
	if l == nil {
		return Limits{}
	}
	return l.limits
}

// Allow spends one of who's requests of kind k. Errors: *Error (matches
// ErrLimited) when who is over its rate; nothing is spent then.
func (l *Limiter) Allow(k Kind, who string) error {
	if l == nil {
		return nil
	}
	b := l.rates[k]
	if wait := b.Take(who); wait > 0 {
		return &Error{Who: who, What: k.what(), Limit: b.Rate().describe(), RetryAfter: wait}
	}
	return nil
}

// capRetry is the wait a cap's refusal suggests: a stream of the caller's
// must end first, which no clock says.
const capRetry = time.Second

// OpenStream holds one of who's open event streams until release is
// called (once). Errors: *Error when who holds OpenStreams already.
func (l *Limiter) OpenStream(who string) (release func(), err error) {
	if l == nil || l.limits.OpenStreams <= 0 {
		return func() {}, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[who] >= l.limits.OpenStreams {
		return nil, &Error{Who: who, What: "event streams open", Limit: fmt.Sprintf("%d at once", l.limits.OpenStreams),
			RetryAfter: capRetry, Cap: true}
	}
	l.open[who]++
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			if l.open[who]--; l.open[who] <= 0 {
				delete(l.open, who)
			}
		})
	}, nil
}

// ErrLimited matches every refusal of a limit (errors.Is).
var ErrLimited = errors.New("over a limit")

// Error is a request refused by a limit: who asked, what for, the limit,
// and how long to wait before asking again.
type Error struct {
	Who   string
	What  string
	Limit string
	// RetryAfter is how long until the request would be allowed (for a
	// cap, a guess: until one of the caller's own ends).
	RetryAfter time.Duration
	// Cap: the limit is how many at once, not a rate.
	Cap bool
}

func (e *Error) Error() string {
	who := e.Who
	if who == "" {
		who = "an unnamed caller"
	}
	if e.Cap {
		return fmt.Sprintf("too many %s for %s (the limit is %s): end one, then try again", e.What, who, e.Limit)
	}
	return fmt.Sprintf("too many %s from %s (the limit is %s): try again in %s", e.What, who, e.Limit, e.RetryAfter)
}

// Is makes every *Error match ErrLimited.
func (e *Error) Is(target error) bool { return target == ErrLimited }

// RetryAfterSeconds is e's wait in whole seconds, rounded up, at least 1:
// an HTTP Retry-After.
func (e *Error) RetryAfterSeconds() int {
	return max(1, int((e.RetryAfter+time.Second-1)/time.Second))
}
