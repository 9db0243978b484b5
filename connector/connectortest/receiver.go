// Package connectortest has receivers for PAL's tests: an HTTP webhook
// receiver (Receiver) and an SMTP server (SMTPReceiver), both on 127.0.0.1
// (reachable from worker processes the test starts), that record every
// delivery and behave, on cue, like a slow or flaky receiver.
//
// The rest of this comment is about the webhook receiver; SMTPReceiver
// records a message once its DATA is read and can hold a session before
// MAIL FROM or before answering DATA.
//
// Invariant: a request is recorded the moment its body has been read, before
// any hold or rule touches it, so a test sees every request that reached
// the receiver, answered or not. Then, in this order:
//
//  1. if an active Hold matches it, it waits until the hold is released, the
//     client gives up, or the receiver closes (which cuts the connection);
//  2. the first FailNext or Drop rule (in the order they were added) that
//     matches it and has uses left decides its fate: an error status, or a
//     connection closed without an answer;
//  3. otherwise it is answered 200 with {"received":true,"idempotency_key":…}.
//
// Rules and holds are consumed when a request arrives, so the order of
// arrival, not of answers, decides which request a rule hits. A nil match
// function matches every request.
package connectortest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/palrun/pal/connector"
)

// maxBody is the largest request body the receiver reads.
const maxBody = 8 << 20

// ErrClosed is returned by Hold.Wait once the receiver has closed and no
// request is left to return.
var ErrClosed = errors.New("connectortest: receiver closed")

// Request is one recorded request.
type Request struct {
	Method string
	Path   string
	// IdempotencyKey, RunID and StepID are the Idempotency-Key, Pal-Run-Id
	// and Pal-Step-Id headers.
	IdempotencyKey string
	RunID          string
	StepID         string
	Header         http.Header
	Body           []byte
	// At is when the request arrived.
	At time.Time
}

func (q Request) clone() Request {
	q.Header = q.Header.Clone()
	q.Body = slices.Clone(q.Body)
	return q
}

// Receiver is a recording HTTP receiver. Its methods are safe for concurrent
// use.
type Receiver struct {
	srv *httptest.Server

	mu       sync.Mutex
	requests []Request
	holds    []*Hold
	rules    []*rule
	closed   chan struct{}

	closeOnce sync.Once
}

// rule is one FailNext (status != 0) or Drop (status == 0).
type rule struct {
	match  func(Request) bool
	status int
	left   int
}

// NewReceiver starts a receiver that is closed when tb's test ends. It fails
// the test if it cannot listen.
func NewReceiver(tb testing.TB) *Receiver {
	tb.Helper()
	r, err := StartReceiver()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(r.Close)
	return r
}

// StartReceiver starts a receiver on a free port of 127.0.0.1. The caller
// must Close it.
func StartReceiver() (*Receiver, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("connectortest: listening on 127.0.0.1: %w", err)
	}
	r := &Receiver{closed: make(chan struct{})}
	r.srv = &httptest.Server{
		Listener: l,
		Config:   &http.Server{Handler: http.HandlerFunc(r.serve), ReadHeaderTimeout: time.Minute},
	}
	r.srv.Start()
	return r, nil
}

// URL is the receiver's base URL, http://127.0.0.1:<port>. Any path under it
// is accepted.
func (r *Receiver) URL() string { return r.srv.URL }

// Close stops the receiver: held requests are released by cutting their
// connections, and Close returns once every handler has finished. It is
// idempotent.
func (r *Receiver) Close() {
	r.closeOnce.Do(func() {
		r.mu.Lock()
		close(r.closed)
		r.mu.Unlock()
		r.srv.Close()
	})
}

// Requests returns every request recorded so far, in order of arrival.
func (r *Receiver) Requests() []Request {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Request, len(r.requests))
	for i, q := range r.requests {
		out[i] = q.clone()
	}
	return out
}

// Count returns how many recorded requests carried idempotency key key.
func (r *Receiver) Count(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, q := range r.requests {
		if q.IdempotencyKey == key {
			n++
		}
	}
	return n
}

// FailNext answers the next n matching requests with status (for example
// 503) and a short JSON error body.
func (r *Receiver) FailNext(match func(Request) bool, status, n int) {
	r.addRule(&rule{match: match, status: status, left: n})
}

// Drop closes the connection of the next n matching requests without
// answering, after reading them whole: the client has sent its request and
// cannot know whether it took effect.
func (r *Receiver) Drop(match func(Request) bool, n int) {
	r.addRule(&rule{match: match, left: n})
}

func (r *Receiver) addRule(ru *rule) {
	if ru.left <= 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rules = append(r.rules, ru)
}

// Hold makes matching requests wait, once recorded, until Release. When
// several active holds match a request, the one added first takes it.
func (r *Receiver) Hold(match func(Request) bool) *Hold {
	h := &Hold{r: r, match: match, release: make(chan struct{}), notify: make(chan struct{})}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.holds = append(r.holds, h)
	return h
}

// Hold is a set of requests kept waiting; see Receiver.Hold.
type Hold struct {
	r       *Receiver
	match   func(Request) bool
	release chan struct{}
	once    sync.Once

	// Guarded by r.mu.
	released bool
	arrived  []Request
	next     int
	notify   chan struct{} // closed and replaced when a request arrives
}

// Wait returns the next request this hold has caught that an earlier Wait
// has not returned, waiting for one to arrive if needed. It returns ctx's
// error when ctx ends first, and ErrClosed when the receiver closes first.
func (h *Hold) Wait(ctx context.Context) (Request, error) {
	for {
		h.r.mu.Lock()
		if h.next < len(h.arrived) {
			q := h.arrived[h.next].clone()
			h.next++
			h.r.mu.Unlock()
			return q, nil
		}
		notify := h.notify
		h.r.mu.Unlock()

		select {
		case <-notify:
		case <-ctx.Done():
			return Request{}, fmt.Errorf("connectortest: waiting for a held request: %w", ctx.Err())
		case <-h.r.closed:
			return Request{}, ErrClosed
		}
	}
}

// Release lets every request held so far go on, and stops holding new ones.
// It is idempotent.
func (h *Hold) Release() {
	h.r.mu.Lock()
	h.released = true
	h.r.mu.Unlock()
	h.once.Do(func() { close(h.release) })
}

func matches(match func(Request) bool, q Request) bool {
	return match == nil || match(q)
}

func (r *Receiver) serve(w http.ResponseWriter, hr *http.Request) {
	b, err := io.ReadAll(io.LimitReader(hr.Body, maxBody))
	if err != nil {
		// A request cut off mid-body never arrived.
		http.Error(w, "connectortest: reading body: "+err.Error(), http.StatusBadRequest)
		return
	}
	q := Request{
		Method:         hr.Method,
		Path:           hr.URL.Path,
		IdempotencyKey: hr.Header.Get(connector.HeaderIdempotencyKey),
		RunID:          hr.Header.Get(connector.HeaderRunID),
		StepID:         hr.Header.Get(connector.HeaderStepID),
		Header:         hr.Header.Clone(),
		Body:           b,
		At:             time.Now(),
	}

	r.mu.Lock()
	r.requests = append(r.requests, q)
	var hold *Hold
	for _, h := range r.holds {
		if !h.released && matches(h.match, q) {
			hold = h
			h.arrived = append(h.arrived, q)
			close(h.notify)
			h.notify = make(chan struct{})
			break
		}
	}
	var fate *rule
	for _, ru := range r.rules {
		if ru.left > 0 && matches(ru.match, q) {
			ru.left--
			fate = ru
			break
		}
	}
	r.mu.Unlock()

	if hold != nil {
		select {
		case <-hold.release:
		case <-r.closed:
			cut(w)
			return
		case <-hr.Context().Done():
			return // the client gave up
		}
	}

	switch {
	case fate != nil && fate.status == 0:
		cut(w)
	case fate != nil:
		answer(w, fate.status, map[string]any{"error": "connectortest: injected failure"})
	default:
		answer(w, http.StatusOK, map[string]any{"received": true, "idempotency_key": q.IdempotencyKey})
	}
}

// cut closes the request's connection without answering.
func cut(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		// Only HTTP/1 connections can be taken over; the receiver serves
		// nothing else, so this is a broken invariant. Answer loudly.
		http.Error(w, "connectortest: cannot drop connection: "+err.Error(), http.StatusInternalServerError)
		return
	}
	_ = conn.Close()
}

func answer(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
