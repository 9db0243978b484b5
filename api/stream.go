package api

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/internal/limit"
)

// runStream is what one event stream (SSE or gRPC StreamRunEvents) sends:
// the run's events after a seq, each once and in seq order, until the
// run's end. It reads the journal in pages (eventstore.Pages: from the
// seq, never from the start, and one page in hand), so a client that reads
// slowly is paced by its connection and costs a page of memory, whatever
// the journal's size. Once a read finds nothing more it joins the run's
// shared feed and reads once again: together they cover every event
// (events sent already are dropped by seq). A stream that the feed drops
// for lagging goes back to pages from its last event instead of ending.
type runStream struct {
	h  *handler
	id string
	// pages reads the journal after the last event sent; nil while the
	// stream follows the feed, and after it was dropped (placed again
	// when next read).
	pages *eventstore.Pages
	q     sequencer
	// pending is read and not sent yet.
	pending []event.Event
	// final: the stream ends once pending is sent (the run's terminal
	// event was read, or the end of a corrupt journal's sound events).
	final bool
	sub   *subscription
	leave func()
}

// errStreamEnded is openStream's answer when the run has ended and every
// event up to its end was received already.
var errStreamEnded = errors.New("the run has ended and every event was received")

// errShuttingDown ends the streams of a server that is stopping (their
// clients resume from the last seq they received).
var errShuttingDown = errors.New("the server is shutting down")

// feedError ends a stream whose run's feed failed for good (its watch of
// the journal failed for followGiveUp).
type feedError struct{ err error }

func (e *feedError) Error() string { return "following the run failed: " + e.err.Error() }
func (e *feedError) Unwrap() error { return e.err }

// openStream starts a stream of the run's events after seq after and
// reads its first page, so that an answer that is no stream is known
// before anything is sent. A run has ended after its terminal event, or
// at the end of a corrupt journal's sound events (§6.1.1: the seal a
// worker appends adds no more of them). Big values stay references, as
// the feed's events carry them (§6.4). Call close when done. Errors:
// eventstore.ErrRunNotFound, *journalRemovedError (a run whose journal
// retention removed), errStreamEnded, and the journal's read errors.
func (h *handler) openStream(ctx context.Context, id string, after uint64) (*runStream, error) {
	s := &runStream{h: h, id: id, q: sequencer{last: after}, leave: func() {}}
	if err := s.read(ctx); err != nil {
		if errors.Is(err, eventstore.ErrRunNotFound) {
			if d, ok := removedRun(ctx, h.rows, h.log, id); ok {
				return nil, &journalRemovedError{runID: id, at: d.Run.JournalRemovedAt}
			}
		}
		return nil, err
	}
	if s.final && len(s.pending) == 0 {
		return nil, errStreamEnded
	}
	return s, nil
}

// read reads the next page of the journal into pending, placing a reader
// after the last event sent if there is none.
func (s *runStream) read(ctx context.Context) error {
	if s.pages == nil {
		p, err := s.h.cfg.Store.Pages(s.id, s.q.last)
		if err != nil {
			return err
		}
		s.pages = p
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	evs, err := s.pages.Next(rctx)
	cancel()
	corrupt := errors.Is(err, event.ErrJournalCorrupt)
	if err != nil && !corrupt {
		return err
	}
	s.pending, s.final = evs, corrupt || s.pages.Ended()
	return nil
}

// close leaves the run's feed, if the stream joined it.
func (s *runStream) close() {
	s.leave()
	s.sub, s.leave = nil, func() {}
}

// sink is where a stream's events go.
type sink struct {
	// send writes one event.
	send func(event.Event) error
	// flush, when set, is called after each batch of events.
	flush func() error
	// keepAlive, when set, is called on an idle stream every
	// HandlerConfig.KeepAlive.
	keepAlive func() error
}

// run sends the stream's events to out until the run's end (nil). Other
// ends: ctx's error, errShuttingDown, *gapError (the feed skipped a seq:
// sending on would break exactly-once), *feedError, out's error, and the
// journal's read errors. The client resumes after the last seq it got.
func (s *runStream) run(ctx context.Context, out sink) error {
	stopping := shutdownSignal(ctx)
	var idle <-chan time.Time
	if out.keepAlive != nil {
		t := time.NewTicker(s.h.cfg.KeepAlive)
		defer t.Stop()
		idle = t.C
	}
	for {
		if len(s.pending) > 0 || s.final {
			if done, err := s.sendPending(out); done || err != nil {
				return err
			}
		}
		switch {
		case s.pages == nil || !s.pages.CaughtUp():
			if err := s.read(ctx); err != nil {
				return err
			}
			continue
		case s.sub == nil:
			// Join the feed from where the read stands, then read once
			// more: what was appended in between.
			sub, leave, err := s.h.feeds.subscribe(ctx, s.id, s.pages.Head())
			if err != nil {
				return err
			}
			s.sub, s.leave = sub, leave
			if err := s.read(ctx); err != nil {
				return err
			}
			continue
		}
		select {
		case p, ok := <-s.sub.events:
			if !ok {
				if err := s.dropped(); err != nil {
					return err
				}
				continue
			}
			done, err := s.send(out, *p)
			// Send what else has arrived before flushing once.
			for more := !done && err == nil; more; {
				select {
				case p, ok := <-s.sub.events:
					if !ok {
						more = false
						break
					}
					done, err = s.send(out, *p)
					more = !done && err == nil
				default:
					more = false
				}
			}
			if ferr := flush(out); err == nil {
				err = ferr
			}
			if done || err != nil {
				return err
			}
		case <-idle:
			if err := out.keepAlive(); err != nil {
				return err
			}
			if err := flush(out); err != nil {
				return err
			}
		case <-stopping:
			return errShuttingDown
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// dropped handles the end of the stream's subscription: one the feed
// dropped for lagging (or that ended before the stream saw the run's
// end) goes back to reading the journal after the last event sent; a
// feed that failed ends the stream.
func (s *runStream) dropped() error {
	err := s.sub.err
	s.h.log.Debug("event stream left the run's feed", "run_id", s.id, "after", s.q.last, "reason", err)
	s.close()
	if err != nil && !errors.Is(err, errLagging) {
		return &feedError{err: err}
	}
	s.pages = nil
	return nil
}

// sendPending sends the events read from the journal, letting go of each
// as it is sent; done after the run's end.
func (s *runStream) sendPending(out sink) (done bool, err error) {
	for i := range s.pending {
		ev := s.pending[i]
		s.pending[i] = event.Event{}
		if done, err = s.send(out, ev); done || err != nil {
			break
		}
	}
	s.pending = nil
	if ferr := flush(out); err == nil {
		err = ferr
	}
	return done || s.final, err
}

// send sends ev unless it was sent already; done after the terminal
// event.
func (s *runStream) send(out sink, ev event.Event) (done bool, err error) {
	ok, err := s.q.next(ev)
	if err != nil || !ok {
		return err != nil, err
	}
	if err := out.send(ev); err != nil {
		return true, err
	}
	return ev.Kind.Terminal(), nil
}

func flush(out sink) error {
	if out.flush == nil {
		return nil
	}
	return out.flush()
}

// gapError is a stream's answer to a seq that skips one: sending it would
// break the exactly-once promise, so the stream ends and the client resumes
// from its last seq.
type gapError struct{ after, got uint64 }

func (e *gapError) Error() string {
	return fmt.Sprintf("gap in the run's feed: event %d after %d", e.got, e.after)
}

// sequencer passes each seq once, in order, from after on.
type sequencer struct{ last uint64 }

// next reports whether ev is the next event to send (false: sent already);
// a gap is an error.
func (q *sequencer) next(ev event.Event) (bool, error) {
	switch {
	case ev.Seq <= q.last:
		return false, nil
	case ev.Seq != q.last+1:
		return false, &gapError{after: q.last, got: ev.Seq}
	}
	q.last = ev.Seq
	return true, nil
}

// admitStream lets the request's token open an event stream: it holds
// one of the token's open streams until release and spends one of its
// stream opens; a refusal spends neither. Errors: *limit.Error (429,
// RESOURCE_EXHAUSTED).
func (h *handler) admitStream(ctx context.Context) (release func(), err error) {
	who := identity(ctx)
	release, err = h.limiter.OpenStream(who)
	if err != nil {
		return nil, err
	}
	if err := h.limiter.Allow(limit.Stream, who); err != nil {
		release()
		return nil, err
	}
	return release, nil
}
