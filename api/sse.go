package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
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
// exactly once. The journal is read from there in pages (runStream), at
// the pace the client reads, then followed live; a comment line keeps an
// idle stream open. A big value is its _blob reference, as stored (§6.4).
// The server ends the stream after the run's terminal event, or after the
// sound events of a corrupt journal (§6.1.1). With ?deltas=1 the text LLM
// steps stream comes too, interleaved, as events with no id (sseDeltas),
// so Last-Event-ID still resumes the journal exactly. A reconnect after the end is
// answered 204 No Content, which tells an EventSource to stop
// reconnecting; it costs one read, of the run's last message. An unknown
// run is a 404 before any stream starts, a run whose journal retention
// removed a 410 journal_removed, and a token over its streams' rate or
// with too many open a 429 with Retry-After.
func (h *handler) streamEvents(w http.ResponseWriter, r *http.Request) {
	id, err := pathRunID(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	after, deltas, err := streamQuery(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	ctx := r.Context()
	release, err := h.admitStream(ctx)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	defer release()
	st, err := h.openStream(ctx, id, after)
	if err != nil {
		if errors.Is(err, errStreamEnded) {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		h.fail(w, r, err)
		return
	}
	defer st.close()

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
	boundSendBuffer(r)
	s := &sseStream{w: w, rc: rc}
	// The headers and the retry line go out at once: a stream with
	// nothing to send yet is open for the client too.
	if err := s.write(fmt.Appendf(nil, "retry: %d\n\n", sseRetryMs)); err != nil || s.flush() != nil {
		return
	}
	out := sink{send: s.event, flush: s.flush, keepAlive: func() error { return s.write([]byte(": keep-alive\n\n")) }}
	if deltas {
		var stop func()
		out, stop = h.withDeltas(ctx, id, out, func(d event.Delta) error { return sseDelta(s, d) })
		defer stop()
	}
	err = st.run(ctx, out)
	var gap *gapError
	var fe *feedError
	switch {
	case errors.As(err, &gap):
		h.log.Warn("event stream ended", "run_id", id, "err", err)
	case errors.As(err, &fe) && ctx.Err() == nil:
		h.log.Info("event stream ended", "run_id", id, "reason", fe.err)
	}
}

// followGiveUp is how long a feed keeps retrying a failing watch before
// it ends its event streams.
const followGiveUp = time.Minute

// streamQuery reads an event stream's request: the seq after which to
// start (Last-Event-ID when sent, a reconnect; else ?after=; else 0), and
// whether it asks for the deltas too (?deltas=1).
func streamQuery(r *http.Request) (after uint64, deltas bool, err error) {
	q := r.URL.Query()
	for k := range q {
		if k != "after" && k != "deltas" {
			return 0, false, &runs.InputError{Field: clipText(k, 40), Msg: "unknown query parameter (want after or deltas)"}
		}
	}
	switch v := q.Get("deltas"); v {
	case "", "0", "false":
	case "1", "true":
		deltas = true
	default:
		return 0, false, &runs.InputError{Field: "deltas", Msg: fmt.Sprintf("%q: want 1 or 0", clipText(v, 40))}
	}
	field, v := "Last-Event-ID", r.Header.Get("Last-Event-ID")
	if v == "" {
		field, v = "after", q.Get("after")
	}
	if v == "" {
		return 0, deltas, nil
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, false, &runs.InputError{Field: field, Msg: fmt.Sprintf("%q: want the seq of the last event received (a whole number)", clipText(v, 40))}
	}
	return n, deltas, nil
}

// withDeltas sends the run's deltas beside the journal's events, for an
// event stream that asked for them (SSE ?deltas=1, gRPC include_deltas):
// a watch of its own (eventstore.Store.WatchDeltas: the text PAL_DELTAS
// holds, then live) hands each to write. It returns out with its writes
// taken in turn with the deltas', and stop, which ends the watch and
// waits for it. A delta can come after the step_completed that ends its
// call: a client drops it by event.Streamed's rule (the call is over). A
// watch that fails costs the stream its deltas, not its events.
func (h *handler) withDeltas(ctx context.Context, id string, out sink, write func(event.Delta) error) (sink, func()) {
	var mu sync.Mutex // one writer at a time on the stream
	locked := func(fn func() error) func() error {
		if fn == nil {
			return nil
		}
		return func() error {
			mu.Lock()
			defer mu.Unlock()
			return fn()
		}
	}
	send := out.send
	out = sink{
		send:      func(ev event.Event) error { return locked(func() error { return send(ev) })() },
		flush:     locked(out.flush),
		keepAlive: locked(out.keepAlive),
	}
	dctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		err := h.cfg.Store.WatchDeltas(dctx, id, func(d event.Delta) error {
			mu.Lock()
			defer mu.Unlock()
			return write(d)
		})
		if err != nil && dctx.Err() == nil {
			h.log.Debug("an event stream's deltas ended", "run_id", id, "err", err)
		}
	}()
	return out, func() {
		cancel()
		<-done
	}
}

// sseDelta writes d on s as
//
//	event: delta
//	data: <event.Delta as one line of JSON>
//
// with no id line, so an EventSource's last id stays the journal's.
func sseDelta(s *sseStream, d event.Delta) error {
	data, err := json.Marshal(d)
	if err != nil {
		return err
	}
	if err := s.write([]byte("event: delta\ndata: "), data, []byte("\n\n")); err != nil {
		return err
	}
	return s.flush()
}

// sseStream writes server-sent events.
type sseStream struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

// write writes parts, as one write as far as the deadline goes.
func (s *sseStream) write(parts ...[]byte) error {
	if err := s.rc.SetWriteDeadline(time.Now().Add(sseWriteTimeout)); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return err
	}
	for _, p := range parts {
		if _, err := s.w.Write(p); err != nil {
			return err
		}
	}
	return nil
}

// event writes ev as one server-sent event. The envelope's JSON is
// written as it is, not copied into a buffer with the lines around it: a
// stream blocked on a slow client holds one copy of its event.
func (s *sseStream) event(ev event.Event) error {
	data, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	return s.write(fmt.Appendf(nil, "id: %d\nevent: %s\ndata: ", ev.Seq, ev.Kind), data, []byte("\n\n"))
}

func (s *sseStream) flush() error { return s.rc.Flush() }

// sseSendBuffer bounds the kernel's send buffer of an event stream's
// connection (HTTP/1.1 only: an HTTP/2 connection carries other
// requests). Left alone, Linux grows it up to net.ipv4.tcp_wmem's
// maximum (4 MiB by default) for a client that does not read, so a
// stream that is paced by its client would still hold megabytes, only
// in the kernel. 256 KiB streams events at 2.5 MB/s over a 100 ms round
// trip.
const sseSendBuffer = 256 << 10

// connKey carries a request's connection (Server sets it).
type connKey struct{}

// boundSendBuffer bounds the send buffer of an HTTP/1 request's
// connection to sseSendBuffer, when Server served it.
func boundSendBuffer(r *http.Request) {
	if c, ok := r.Context().Value(connKey{}).(interface{ SetWriteBuffer(int) error }); ok && r.ProtoMajor == 1 {
		_ = c.SetWriteBuffer(sseSendBuffer)
	}
}

type shutdownKey struct{}

// shutdownSignal returns the channel Server closes when it begins to shut
// down (nil, never ready, outside a Server), so open event streams end
// and let the shutdown finish.
func shutdownSignal(ctx context.Context) <-chan struct{} {
	ch, _ := ctx.Value(shutdownKey{}).(chan struct{})
	return ch
}
