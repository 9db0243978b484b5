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
	"github.com/palrun/pal/workers"
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
// as they are appended; a comment line keeps an idle stream open. The
// server ends the stream after the run's terminal event. A reconnect
// after the terminal event is answered 204 No Content, which tells an
// EventSource to stop reconnecting. An unknown run is a 404 before any
// stream starts.
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
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	evs, head, err := h.cfg.Store.Read(rctx, id)
	cancel()
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if evs[len(evs)-1].Kind.Terminal() && after >= head.Seq {
		w.WriteHeader(http.StatusNoContent)
		return
	}

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
	for _, ev := range evs {
		if ev.Seq <= after {
			continue
		}
		if err := s.event(ev); err != nil {
			return
		}
		if ev.Kind.Terminal() {
			_ = s.flush()
			return
		}
	}
	if err := s.flush(); err != nil {
		return
	}

	// Follow the journal from where the read ended.
	wctx, stopWatch := context.WithCancel(ctx)
	evCh := make(chan event.Event, 64)
	watchDone := make(chan error, 1)
	go func() { watchDone <- h.follow(wctx, id, head, evCh) }()
	defer func() {
		stopWatch()
		<-watchDone
	}()
	keepAlive := time.NewTicker(h.cfg.KeepAlive)
	defer keepAlive.Stop()
	stopping := shutdownSignal(ctx)
	for {
		select {
		case ev := <-evCh:
			if err := s.event(ev); err != nil {
				return
			}
			if ev.Kind.Terminal() {
				_ = s.flush()
				return
			}
			// Write what else has arrived before flushing once.
			for more := true; more; {
				select {
				case ev := <-evCh:
					if err := s.event(ev); err != nil {
						return
					}
					if ev.Kind.Terminal() {
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
		case err := <-watchDone:
			watchDone <- err // for the deferred wait
			for len(evCh) > 0 {
				if err := s.event(<-evCh); err != nil {
					return
				}
			}
			_ = s.flush()
			if ctx.Err() == nil {
				// The watch kept failing (NATS gone for a while): end the
				// stream; the client resumes from its last id.
				h.log.Warn("event stream ended: watching the journal failed", "run_id", id, "err", err)
			}
			return
		case <-stopping:
			return
		case <-ctx.Done():
			return
		}
	}
}

// followGiveUp is how long follow keeps retrying a failing watch before
// it ends the stream.
const followGiveUp = time.Minute

// follow sends the run's events after head to out, in order, until ctx
// ends. A watch that fails (a timeout while JetStream is busy, NATS
// reconnecting) is started again after the last event sent, so the
// stream has no gap and no duplicate; follow gives up when the watch has
// failed for followGiveUp with nothing delivered.
func (h *handler) follow(ctx context.Context, runID string, head eventstore.Head, out chan<- event.Event) error {
	from := head
	delay := 50 * time.Millisecond
	var failingSince time.Time
	for {
		delivered := false
		err := h.cfg.Store.Watch(ctx, runID, from, func(ev event.Event) error {
			select {
			case out <- ev:
				// Resume after ev; the stream seq stays at head's, which
				// is at or before ev's message, and Watch skips what
				// was already sent by seq.
				from.Seq, delivered = ev.Seq, true
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if delivered || failingSince.IsZero() {
			failingSince, delay = time.Now(), 50*time.Millisecond
		} else if time.Since(failingSince) > followGiveUp {
			return err
		}
		h.log.Debug("watching the journal failed; retrying", "run_id", runID, "err", err)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		delay = min(delay*2, 2*time.Second)
	}
}

// resumeAfter returns the seq after which to start: Last-Event-ID when
// sent (a reconnect), else ?after=, else 0.
func resumeAfter(r *http.Request) (uint64, error) {
	q := r.URL.Query()
	for k := range q {
		if k != "after" {
			return 0, &workers.InputError{Field: k, Msg: "unknown query parameter (want after)"}
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
		return 0, &workers.InputError{Field: field, Msg: fmt.Sprintf("%q: want the seq of the last event received (a whole number)", v)}
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
