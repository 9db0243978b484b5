package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/runs"
)

// sseWriteTimeout bounds one write to an event stream: a client that stops
// reading is dropped instead of holding its stream open.
const sseWriteTimeout = 30 * time.Second

// sseRetryMs is the reconnection delay suggested to clients.
const sseRetryMs = 1000

// streamEvents serves GET /v1/runs/{id}/events: the run's journal as
// server-sent events, one per journal event:
//
//	id: <seq>
//	event: <kind>
//	data: <the event envelope as one line of JSON>
//
// It starts after the seq given by the Last-Event-ID header or, when that
// is absent, the after query parameter (0: from the beginning), so a
// client that reconnects with the last id it saw gets every later event
// exactly once. Events already in the journal are sent at once, new ones
// as they are appended; a comment line keeps an idle stream open. A big
// value is its _blob reference, as stored (§6.4). The server ends the
// stream after the run's terminal event, or after the sound events of a
// corrupt journal (§6.1.1). A reconnect after the end is answered 204 No
// Content, which tells an EventSource to stop reconnecting. An unknown run
// is a 404 before any stream starts, and a run whose journal retention
// removed a 410 journal_removed.
func (h *handler) streamEvents(w http.ResponseWriter, r *http.Request) {
	id, err := pathRunID(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	after, err := resumeAfter(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	ctx := r.Context()
	evs, sub, leave, err := h.openJournal(ctx, id, after, r.Method != http.MethodHead)
	if err != nil {
		if errors.Is(err, errStreamEnded) {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		h.fail(w, r, err)
		return
	}
	defer leave()

	rc := http.NewResponseController(w)
	// No read deadline on a stream: the server's background read is how
	// a client that goes away is noticed.
	if err := rc.SetReadDeadline(time.Time{}); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return
	}
	hdr := w.Header()
	hdr.Set("Content-Type", "text/event-stream")
	hdr.Set("Cache-Control", "no-cache")
	hdr.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	s := &sseStream{w: w, rc: rc}
	if err := s.write(fmt.Appendf(nil, "retry: %d\n\n", sseRetryMs)); err != nil {
		return
	}
	// send writes ev unless it was sent already; done reports the end of
	// the stream (the terminal event, a write error, a gap).
	q := sequencer{last: after}
	send := func(ev event.Event) (done bool) {
		ok, err := q.next(ev)
		if err != nil {
			h.log.Warn("event stream ended", "run_id", id, "err", err)
			return true
		}
		if !ok {
			return false
		}
		if err := s.event(ev); err != nil {
			return true
		}
		return ev.Kind.Terminal()
	}
	for _, ev := range evs {
		if send(ev) {
			_ = s.flush()
			return
		}
	}
	if err := s.flush(); err != nil || sub == nil {
		return
	}

	keepAlive := time.NewTicker(h.cfg.KeepAlive)
	defer keepAlive.Stop()
	stopping := shutdownSignal(ctx)
	for {
		select {
		case p, ok := <-sub.events:
			if !ok {
				if sub.err != nil && ctx.Err() == nil {
					h.log.Info("event stream ended", "run_id", id, "reason", sub.err)
				}
				_ = s.flush()
				return
			}
			if send(*p) {
				_ = s.flush()
				return
			}
			// Write what else has arrived before flushing once.
			for more := true; more; {
				select {
				case p, ok := <-sub.events:
					if !ok {
						more = false
						break
					}
					if send(*p) {
						_ = s.flush()
						return
					}
				default:
					more = false
				}
			}
			if err := s.flush(); err != nil {
				return
			}
		case <-keepAlive.C:
			if err := s.write([]byte(": keep-alive\n\n")); err != nil {
				return
			}
			if err := s.flush(); err != nil {
				return
			}
		case <-stopping:
			return
		case <-ctx.Done():
			return
		}
	}
}

// errStreamEnded is openJournal's answer when the run has ended and every
// event up to its terminal one was received already.
var errStreamEnded = errors.New("the run has ended and every event was received")

// openJournal reads the run's journal for a stream that starts after seq
// after, and, when follow is set and the run has not ended, joins its live
// feed. The events returned cover every event up to the moment sub joined
// (a later read closes the gap between the first read and the join); sub
// then delivers those appended later, possibly overlapping them, so the
// caller drops any seq it has sent. Big values stay references, as the
// feed's events carry them (§6.4): an event reads the same whether it was
// sent from the history or live. A run has ended after its terminal event,
// or when its journal is corrupt (§6.1.1: the sound events are all there
// is; the seal a worker appends adds no more of them). sub is nil when the
// run has ended or follow is unset; leave is never nil. Errors: those of
// Store.ReadAfterRefs bar the corrupt journal, eventstore.ErrRunNotFound,
// *journalRemovedError (a run whose journal retention removed) and
// errStreamEnded.
func (h *handler) openJournal(ctx context.Context, id string, after uint64, follow bool) (evs []event.Event, sub *subscription, leave func(), err error) {
	leave = func() {}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	evs, head, err := h.cfg.Store.ReadAfterRefs(rctx, id, eventstore.Head{})
	cancel()
	ended := errors.Is(err, event.ErrJournalCorrupt)
	switch {
	case ended:
	case err != nil:
		return nil, nil, leave, err
	case len(evs) == 0:
		if d, ok := removedRun(ctx, h.rows, h.log, id); ok {
			return nil, nil, leave, &journalRemovedError{runID: id, at: d.Run.JournalRemovedAt}
		}
		return nil, nil, leave, fmt.Errorf("reading run %s: %w", id, eventstore.ErrRunNotFound)
	default:
		ended = evs[len(evs)-1].Kind.Terminal()
	}
	if ended && after >= head.Seq {
		return nil, nil, leave, errStreamEnded
	}
	if ended || !follow {
		return evs, nil, leave, nil
	}
	// Join the run's feed, then read what was appended since the read
	// above: together they cover every event.
	sub, leave, err = h.feeds.subscribe(ctx, id)
	if err != nil {
		return nil, nil, func() {}, err
	}
	rctx, cancel = context.WithTimeout(ctx, 30*time.Second)
	more, _, err := h.cfg.Store.ReadAfterRefs(rctx, id, head)
	cancel()
	if errors.Is(err, event.ErrJournalCorrupt) {
		// Corrupt since the first read: the run is over.
		leave()
		return append(evs, more...), nil, func() {}, nil
	}
	if err != nil {
		leave()
		return nil, nil, func() {}, err
	}
	return append(evs, more...), sub, leave, nil
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

// followGiveUp is how long a feed keeps retrying a failing watch before
// it ends its event streams.
const followGiveUp = time.Minute

// resumeAfter returns the seq after which to start: Last-Event-ID when
// sent (a reconnect), else ?after=, else 0.
func resumeAfter(r *http.Request) (uint64, error) {
	q := r.URL.Query()
	for k := range q {
		if k != "after" {
			return 0, &runs.InputError{Field: clipText(k, 40), Msg: "unknown query parameter (want after)"}
		}
	}
	field, v := "Last-Event-ID", r.Header.Get("Last-Event-ID")
	if v == "" {
		field, v = "after", q.Get("after")
	}
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, &runs.InputError{Field: field, Msg: fmt.Sprintf("%q: want the seq of the last event received (a whole number)", clipText(v, 40))}
	}
	return n, nil
}

// sseStream writes server-sent events.
type sseStream struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

func (s *sseStream) write(p []byte) error {
	if err := s.rc.SetWriteDeadline(time.Now().Add(sseWriteTimeout)); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return err
	}
	_, err := s.w.Write(p)
	return err
}

func (s *sseStream) event(ev event.Event) error {
	data, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	buf := make([]byte, 0, len(data)+64)
	buf = fmt.Appendf(buf, "id: %d\nevent: %s\ndata: ", ev.Seq, ev.Kind)
	buf = append(buf, data...)
	buf = append(buf, '\n', '\n')
	return s.write(buf)
}

func (s *sseStream) flush() error { return s.rc.Flush() }

type shutdownKey struct{}

// shutdownSignal returns the channel Server closes when it begins to shut
// down (nil, never ready, outside a Server), so open event streams end
// and let the shutdown finish.
func shutdownSignal(ctx context.Context) <-chan struct{} {
	ch, _ := ctx.Value(shutdownKey{}).(chan struct{})
	return ch
}
