package api

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/internal/retry"
)

// feeds shares one journal watch per run among all the event streams of
// that run: a run with 200 watchers costs one ordered consumer on
// PAL_EVENTS, not 200, and each event is read from JetStream once.
//
// A feed starts at the run's head when its first subscriber arrives and
// hands every later event, in order, to every subscriber. A subscriber
// that falls behind by more than subscriptionBuffer events is dropped
// (its stream goes back to reading the journal in pages, runStream)
// instead of holding up the others. The feed stops when its last subscriber leaves,
// after the run's terminal event, or when its watch has failed for
// followGiveUp.
type feeds struct {
	store *eventstore.Store
	log   *slog.Logger

	mu   sync.Mutex
	runs map[string]*feed
}

// subscriptionBuffer is how many events a subscriber may lag behind.
const subscriptionBuffer = 512

// errLagging ends a subscription that fell behind.
var errLagging = errors.New("the client fell behind the run's events")

type feed struct {
	runID string
	// ready is closed once start (or err) is set.
	ready chan struct{}
	start eventstore.Head
	err   error
	// done is closed when the feed's goroutine has returned.
	done chan struct{}

	// Guarded by feeds.mu.
	cancel context.CancelFunc
	subs   map[*subscription]struct{}
}

// subscription receives a feed's events. events is closed when the feed
// ends or drops the subscriber; err then says why (nil after the run's
// terminal event).
//
// The channel carries pointers, shared by every subscriber of the feed
// and never written to: a buffer of 512 events is then 4 KiB per
// subscriber, not 86 KiB, which is what lets one server hold 10,000
// streams (TestSSEWatchers).
type subscription struct {
	events chan *event.Event
	err    error
}

func newFeeds(store *eventstore.Store, log *slog.Logger) *feeds {
	return &feeds{store: store, log: log, runs: map[string]*feed{}}
}

// subscribe joins the run's feed, starting one if there is none, and
// returns once the feed knows where it starts: every event appended after
// subscribe returns reaches the subscription (unless it is dropped). A
// feed it starts watches from the head from, when the caller knows one
// (it has just read the journal up to there), else from the run's last
// message (one read). Call leave when done.
func (f *feeds) subscribe(ctx context.Context, runID string, from eventstore.Head) (sub *subscription, leave func(), err error) {
	sub = &subscription{events: make(chan *event.Event, subscriptionBuffer)}
	f.mu.Lock()
	fd := f.runs[runID]
	creator := fd == nil
	if creator {
		fd = &feed{runID: runID, ready: make(chan struct{}), done: make(chan struct{}), subs: map[*subscription]struct{}{}}
		f.runs[runID] = fd
	}
	fd.subs[sub] = struct{}{}
	f.mu.Unlock()
	leave = func() { f.leave(fd, sub) }

	if creator {
		fd.start = from
		if from.StreamSeq == 0 {
			hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			fd.start, fd.err = f.store.LastHead(hctx, runID)
			cancel()
		}
		f.mu.Lock()
		if fd.err == nil {
			wctx, stop := context.WithCancel(context.Background())
			fd.cancel = stop
			go f.run(wctx, fd)
		} else {
			// Forget the failed feed at once: the next subscriber tries
			// again.
			if f.runs[runID] == fd {
				delete(f.runs, runID)
			}
			close(fd.done)
		}
		close(fd.ready)
		f.mu.Unlock()
	}
	select {
	case <-fd.ready:
	case <-ctx.Done():
		leave()
		return nil, nil, ctx.Err()
	}
	if fd.err != nil {
		leave()
		return nil, nil, fd.err
	}
	return sub, leave, nil
}

// leave removes sub from its feed; the last one to leave stops the feed
// and waits for its goroutine.
func (f *feeds) leave(fd *feed, sub *subscription) {
	f.mu.Lock()
	delete(fd.subs, sub)
	last := len(fd.subs) == 0
	if last && f.runs[fd.runID] == fd {
		delete(f.runs, fd.runID)
	}
	cancel := fd.cancel
	f.mu.Unlock()
	if !last {
		return
	}
	// The creator leaves only after ready, so a feed that is still
	// starting always has a subscriber: here it has started (or failed).
	<-fd.ready
	if cancel != nil {
		cancel()
	}
	<-fd.done
}

// run watches the journal from the feed's start and fans the events out,
// restarting a watch that fails after the last event it delivered. A watch
// that delivered events before it failed starts the backoff and the
// give-up clock afresh.
func (f *feeds) run(ctx context.Context, fd *feed) {
	defer close(fd.done)
	from := fd.start
	var failingSince time.Time
	delivered, terminal := false, false
	err := retry.Do(ctx, feedRetry, func() error {
		delivered = false
		err := f.store.Watch(ctx, fd.runID, from, func(ev event.Event) error {
			f.fanout(fd, ev)
			// Resume after ev: the stream seq stays at the start's, at or
			// before ev's message, and Watch skips what was sent by seq.
			from.Seq, delivered = ev.Seq, true
			if ev.Kind.Terminal() {
				terminal = true
				return eventstore.ErrStopWatch
			}
			return nil
		})
		switch {
		case terminal:
			return nil
		case ctx.Err() != nil:
			return retry.Permanent(ctx.Err())
		case delivered || failingSince.IsZero():
			failingSince = time.Now()
		case time.Since(failingSince) > followGiveUp:
			return retry.Permanent(err)
		}
		return err
	}, retry.Restart(func() bool { return delivered }), retry.OnRetry(func(err error, _ int, _ time.Duration) {
		f.log.Debug("watching the journal failed; retrying", "run_id", fd.runID, "err", err)
	}))
	var endErr error
	if err != nil && ctx.Err() == nil {
		endErr = err
		f.log.Warn("watching the journal failed; ending its event streams", "run_id", fd.runID, "err", err)
	}
	f.end(fd, endErr)
}

// feedRetry paces the restarts of a failing journal watch.
var feedRetry = retry.Policy{Initial: 50 * time.Millisecond, Max: 2 * time.Second}

// fanout hands ev to every subscriber without blocking, dropping those
// whose buffer is full.
func (f *feeds) fanout(fd *feed, ev event.Event) {
	shared := &ev
	f.mu.Lock()
	defer f.mu.Unlock()
	for sub := range fd.subs {
		select {
		case sub.events <- shared:
		default:
			delete(fd.subs, sub)
			sub.err = errLagging
			close(sub.events)
		}
	}
}

// end closes the feed's subscriptions and forgets the feed.
func (f *feeds) end(fd *feed, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.runs[fd.runID] == fd {
		delete(f.runs, fd.runID)
	}
	for sub := range fd.subs {
		delete(fd.subs, sub)
		sub.err = err
		close(sub.events)
	}
}

// size reports how many feeds are running (for tests).
func (f *feeds) size() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.runs)
}
