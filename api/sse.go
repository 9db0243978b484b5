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

	terminal := evs[len(evs)-1].Kind.Terminal()
	var sub *subscription
	if !terminal && r.Method != http.MethodHead {
		// Join the run's feed, then read what was appended since the
		// read above: together they cover every event, and the seq
		// check below drops the overlap.
		var leave func()
		sub, leave, err = h.feeds.subscribe(ctx, id)
		if err != nil {
			h.fail(w, r, err)
			return
		}
		defer leave()
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		more, _, err := h.cfg.Store.ReadAfter(rctx, id, head)
		cancel()
		if err != nil {
			h.fail(w, r, err)
			return
		}
		evs = append(evs, more...)
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
	// send writes ev unless it was sent already; done reports the end of
	// the stream (the terminal event, a write error, a gap).
	last := after
	send := func(ev event.Event) (done bool) {
		switch {
		case ev.Seq <= last:
			return false
		case ev.Seq != last+1:
			// A gap would break the exactly-once promise: end the stream
			// and let the client resume from its last id.
			h.log.Warn("event stream ended: gap in the feed", "run_id", id, "after", last, "got", ev.Seq)
			return true
		}
		if err := s.event(ev); err != nil {
			return true
		}
		last = ev.Seq
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
		case ev, ok := <-sub.events:
			if !ok {
				if sub.err != nil && ctx.Err() == nil {
					h.log.Info("event stream ended", "run_id", id, "reason", sub.err)
				}
				_ = s.flush()
				return
			}
			if send(ev) {
				_ = s.flush()
				return
			}
			// Write what else has arrived before flushing once.
			for more := true; more; {
				select {
				case ev, ok := <-sub.events:
					if !ok {
						more = false
						break
					}
					if send(ev) {
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

// followGiveUp is how long a feed keeps retrying a failing watch before
// it ends its event streams.
const followGiveUp = time.Minute

// resumeAfter returns the seq after which to start: Last-Event-ID when
// sent (a reconnect), else ?after=, else 0.
func resumeAfter(r *http.Request) (uint64, error) {
	q := r.URL.Query()
	for k := range q {
		if k != "after" {
			return 0, &runs.InputError{Field: k, Msg: "unknown query parameter (want after)"}
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
		return 0, &runs.InputError{Field: field, Msg: fmt.Sprintf("%q: want the seq of the last event received (a whole number)", v)}
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
