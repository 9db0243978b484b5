// Package providertest is a fake LLM provider for PAL's tests and for the
// `pal dev` demo: an HTTP server on 127.0.0.1 that speaks both the OpenAI
// Chat Completions wire format (POST /v1/chat/completions) and the Anthropic
// Messages wire format (POST /v1/messages), well enough for the official
// SDKs to parse its answers, tool calls included. A request with "stream":
// true is answered with server-sent events as each API streams them, a
// delta per word, SetPace apart (PAL's providers always stream).
//
// Invariant: every request is recorded, with its idempotency key, before it
// is held, failed, dropped or answered, so that tests can assert that a key
// reached the provider once.
//
// It can misbehave on cue: hold requests until released (Hold), answer with
// an HTTP error (FailNext, FailNextWithHeader), rate-limit with 429 and
// Retry-After (RateLimit), cut the connection without answering (Drop),
// answer slowly (SetLatency), stop a streamed answer midway until released
// (HoldAfter) and replay the first answer for a repeated idempotency key
// (Dedup), like a provider that honours keys. MaxConcurrent observes how
// many requests it handled at once, InFlight how many it is handling now,
// Answered and Abandoned which were answered and which their client gave
// up on (a cancelled call, or a stream its client left midway);
// Reply.Logprobs scripts token log probabilities, Reply.Reasoning thinking
// text, and the Reply's token counts the usage, cached input included.
//
// The default answer is deterministic: "echo: " followed by the last user
// message, with token counts taken from word counts. SetResponder scripts
// other answers; a request that carries a workflow node's fake block (the
// X-Pal-Fake header, see script.go) is answered from it first.
//
// A Server listens on TCP so that worker processes started by a test can
// reach it: pass Env() to their environment.
package providertest

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/palrun/pal/provider"
	"github.com/palrun/pal/workflow"
)

// Provider names recorded in Call.Provider.
const (
	OpenAI    = "openai"
	Anthropic = "anthropic"
)

// ErrClosed is returned by Hold.Wait once the server is closed.
var ErrClosed = errors.New("providertest: server closed")

// Call is one request the server received.
type Call struct {
	// Provider is the wire format: OpenAI or Anthropic.
	Provider string
	Path     string
	// IdempotencyKey is the Idempotency-Key header ("" when absent).
	IdempotencyKey string
	Model          string
	// Messages are the conversation in PAL's form. System prompts are in
	// System, not here; Anthropic tool_result blocks are tool messages.
	Messages []provider.Message
	System   string
	// Tools are the names of the tools the request offered.
	Tools []string
	// Logprobs: the request asked for token log probabilities (OpenAI).
	Logprobs bool
	// Stream: the request asked for a streamed answer.
	Stream bool
	// MaxTokens is the output cap the request sent (OpenAI
	// max_completion_tokens or max_tokens, Anthropic max_tokens), 0 when
	// none.
	MaxTokens int
	// ResponseSchema is the JSON Schema the request asked the answer to
	// match (OpenAI response_format json_schema, Anthropic
	// output_config.format), nil when none.
	ResponseSchema json.RawMessage
	// Fake is the workflow node's fake block the request carried (the
	// X-Pal-Fake header; see script.go), nil when none.
	Fake   *workflow.Fake
	Body   []byte
	Header http.Header
	At     time.Time
	// streamUsage: a streamed answer ends with its usage.
	streamUsage bool
}

// LastUser returns the content of the call's last user message.
func (c Call) LastUser() string {
	for i := len(c.Messages) - 1; i >= 0; i-- {
		if c.Messages[i].Role == provider.RoleUser {
			return c.Messages[i].Content
		}
	}
	return ""
}

// Reply is a scripted answer.
type Reply struct {
	Text      string
	ToolCalls []provider.ToolCall
	// Status, unless 0 or 200, makes the answer an error with this HTTP
	// status and the provider's error body.
	Status int
	// InputTokens and OutputTokens override the word counts when non-zero.
	// InputTokens counts the whole input: CacheReadTokens and
	// CacheWriteTokens are parts of it (Anthropic's wire format sends the
	// rest as input_tokens). ReasoningTokens are part of OutputTokens.
	InputTokens, OutputTokens                          int64
	CacheReadTokens, CacheWriteTokens, ReasoningTokens int64
	// Reasoning is thinking text, sent before the answer (an Anthropic
	// thinking block; OpenAI-compatible reasoning_content when streamed).
	Reasoning string
	// Logprobs are the answer's token log probabilities, one per token,
	// sent (OpenAI wire format only) when the request asked for them.
	Logprobs []float64
}

// Server is the fake provider. Its methods are safe for concurrent use.
type Server struct {
	ln   net.Listener
	srv  *http.Server
	url  string
	done chan struct{} // closed when Serve returned

	mu        sync.Mutex
	closed    bool
	closing   chan struct{} // closed by Close: wakes held requests
	handlers  sync.WaitGroup
	calls     []Call
	responder func(Call) Reply
	dedup     bool
	answers   map[string]answer   // by idempotency key, with Dedup
	inFlight  map[string]struct{} // keys being answered, with Dedup
	holds     []*Hold
	faults    []*fault
	seq       int
	latency   time.Duration
	pace      time.Duration
	onDelta   func(Call, int)
	active    int // requests being handled now
	maxActive int // the most handled at once since the start or Reset
	// answered are the requests answered with 200, abandoned those whose
	// client went away before an answer (a cancelled call).
	answered  []Call
	abandoned []Call
	// fakeSteps counts the requests of each step that carried a fake
	// block with fail (script.go), the last maxFakeSteps steps.
	fakeSteps *lru.Cache[string, int]
}

// answer is an answer the server gave, kept for Dedup: an error's status
// and body, or a successful reply (status 200), sent again streamed or not
// as the repeated request asks.
type answer struct {
	status int
	body   []byte
	reply  Reply
	id     int
}

// fault is a FailNext or Drop rule.
type fault struct {
	match  func(Call) bool
	status int // 0: drop the connection
	header http.Header
	left   int
}

// New starts a server on a free port of 127.0.0.1.
func New() (*Server, error) { return Start("127.0.0.1:0") }

// NewServer starts a server on a free port of 127.0.0.1 and closes it when
// the test ends. It fails the test if the server cannot start.
func NewServer(tb testing.TB) *Server {
	tb.Helper()
	s, err := New()
	if err != nil {
		tb.Fatalf("starting fake provider: %v", err)
	}
	tb.Cleanup(s.Close)
	return s
}

// Start starts a server listening on addr ("127.0.0.1:0" for a free port),
// e.g. for the `pal dev` demo.
func Start(addr string) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("providertest: listening on %s: %w", addr, err)
	}
	s := &Server{
		ln:       ln,
		url:      "http://" + ln.Addr().String(),
		done:     make(chan struct{}),
		closing:  make(chan struct{}),
		answers:  map[string]answer{},
		inFlight: map[string]struct{}{},
	}
	s.fakeSteps, _ = lru.New[string, int](maxFakeSteps) // fails only for a size below 1
	s.srv = &http.Server{Handler: http.HandlerFunc(s.serveHTTP), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		defer close(s.done)
		_ = s.srv.Serve(ln)
	}()
	return s, nil
}

// URL is the server's root, e.g. "http://127.0.0.1:38211".
func (s *Server) URL() string { return s.url }

// OpenAIBaseURL is the value for OPENAI_BASE_URL: URL()+"/v1".
func (s *Server) OpenAIBaseURL() string { return s.url + "/v1" }

// AnthropicBaseURL is the value for ANTHROPIC_BASE_URL: URL().
func (s *Server) AnthropicBaseURL() string { return s.url }

// Env returns the environment that points both providers' SDKs at the
// server, for worker processes: OPENAI_BASE_URL, OPENAI_API_KEY=test,
// ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY=test.
func (s *Server) Env() []string {
	return []string{
		"OPENAI_BASE_URL=" + s.OpenAIBaseURL(),
		"OPENAI_API_KEY=test",
		"ANTHROPIC_BASE_URL=" + s.AnthropicBaseURL(),
		"ANTHROPIC_API_KEY=test",
	}
}

// Close stops the server: held requests end without an answer, open
// connections are closed, and Close returns once every handler has
// returned. It is idempotent.
func (s *Server) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	close(s.closing)
	s.mu.Unlock()

	_ = s.srv.Close()
	<-s.done
	s.handlers.Wait()
}

// SetResponder scripts the answers: fn is called for every request that is
// not held up, failed or dropped, and its Reply is sent in the request's wire
// format. nil restores the default echo answer.
func (s *Server) SetResponder(fn func(Call) Reply) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.responder = fn
}

// Dedup makes the server honour idempotency keys: a request whose key was
// answered successfully before gets the same answer again (and is still
// recorded); a request whose key is being answered right now gets 409
// Conflict. Error answers are not kept, so a failed request can be retried
// with its key.
func (s *Server) Dedup(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dedup = on
}

// FailNext makes the next n requests that match (nil matches all) fail with
// status and the provider's error body. Rules apply in the order they were
// added. match, here and in Drop, is called with the server's lock held: it
// must not call the Server's methods.
func (s *Server) FailNext(match func(Call) bool, status int, n int) {
	s.addFault(match, status, n, nil)
}

// FailNextWithHeader is FailNext whose error answers carry header (a
// provider's Retry-After or rate-limit headers).
func (s *Server) FailNextWithHeader(match func(Call) bool, status int, n int, header http.Header) {
	s.addFault(match, status, n, header)
}

// RateLimit is the rate-limit mode: the next n requests that match answer
// 429 Too Many Requests with Retry-After: retryAfter (whole seconds,
// rounded up), as both providers do.
func (s *Server) RateLimit(match func(Call) bool, n int, retryAfter time.Duration) {
	secs := int64((retryAfter + time.Second - 1) / time.Second)
	s.addFault(match, http.StatusTooManyRequests, n, http.Header{"Retry-After": {fmt.Sprint(secs)}})
}

// SetPace spaces a streamed answer's deltas d apart (0: none): `pal dev`
// streams its answers word by word at a readable pace.
func (s *Server) SetPace(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pace = d
}

// OnDelta makes fn observe a streamed answer: it is called with the call
// and the delta's index as each delta is written, right before it is
// flushed to the client (nil: no observer). It is how a benchmark times a
// delta from the provider to a watcher.
func (s *Server) OnDelta(fn func(c Call, index int)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onDelta = fn
}

// SetLatency makes every answer wait d before it is sent (0: none), so that
// concurrent callers overlap and MaxConcurrent can see them.
func (s *Server) SetLatency(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.latency = d
}

// MaxConcurrent is the most requests the server was handling at once since
// it started or was Reset: the max-concurrency observer.
func (s *Server) MaxConcurrent() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.maxActive
}

// InFlight is how many requests the server is handling now: held,
// waiting out SetLatency, or being answered.
func (s *Server) InFlight() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.active
}

// Answered returns the requests answered with 200 since the start or
// Reset, in the order they were answered.
func (s *Server) Answered() []Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Call(nil), s.answered...)
}

// Abandoned returns the requests whose client went away before they were
// answered (a call cancelled while held or slow), in that order, since the
// start or Reset.
func (s *Server) Abandoned() []Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Call(nil), s.abandoned...)
}

// record appends c to *to under the lock.
func (s *Server) record(to *[]Call, c Call) {
	s.mu.Lock()
	defer s.mu.Unlock()
	*to = append(*to, c)
}

// Drop makes the next n requests that match (nil matches all) end with their
// connection closed and no answer, after the request was read in full: the
// client cannot know whether the provider did the work.
func (s *Server) Drop(match func(Call) bool, n int) {
	s.addFault(match, 0, n, nil)
}

func (s *Server) addFault(match func(Call) bool, status, n int, header http.Header) {
	if n <= 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = append(s.faults, &fault{match: match, status: status, header: header, left: n})
}

// Calls returns every request received since the start or the last Reset, in
// order of arrival.
func (s *Server) Calls() []Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Call(nil), s.calls...)
}

// Keys returns, for each idempotency key received, how many requests
// carried it. Requests without a key are not counted.
func (s *Server) Keys() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := map[string]int{}
	for _, c := range s.calls {
		if c.IdempotencyKey != "" {
			keys[c.IdempotencyKey]++
		}
	}
	return keys
}

// CallsWithKey returns the requests that carried key, in order of arrival.
func (s *Server) CallsWithKey(key string) []Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Call
	for _, c := range s.calls {
		if c.IdempotencyKey == key {
			out = append(out, c)
		}
	}
	return out
}

// Reset forgets the recorded requests, the answers kept for Dedup, the
// pending FailNext and Drop rules and the steps' counts of fake-block
// failures. The responder, the Dedup setting and the holds stay.
func (s *Server) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls, s.answered, s.abandoned = nil, nil, nil
	s.answers = map[string]answer{}
	s.faults = nil
	s.fakeSteps.Purge()
	s.maxActive = s.active
}

// ByKey matches the calls that carry the idempotency key.
func ByKey(key string) func(Call) bool {
	return func(c Call) bool { return c.IdempotencyKey == key }
}

// ByProvider matches the calls in a provider's wire format (OpenAI or
// Anthropic).
func ByProvider(name string) func(Call) bool {
	return func(c Call) bool { return c.Provider == name }
}

func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		dropConn(w)
		return
	}
	s.handlers.Add(1)
	s.mu.Unlock()
	defer s.handlers.Done()

	var wf wire
	switch strings.TrimSuffix(r.URL.Path, "/") {
	case "/v1/chat/completions", "/chat/completions":
		wf = openAIWire{}
	case "/v1/messages":
		wf = anthropicWire{}
	default:
		writeJSON(w, http.StatusNotFound, openAIWire{}.fail(http.StatusNotFound,
			fmt.Sprintf("fake provider: no route %s %s (want POST /v1/chat/completions or POST /v1/messages)", r.Method, r.URL.Path)))
		return
	}
	if r.Method != http.MethodPost {
		writeJSON(w, http.StatusMethodNotAllowed, wf.fail(http.StatusMethodNotAllowed, "fake provider: use POST"))
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return // the client went away
	}
	call := Call{
		Provider:       wf.name(),
		Path:           r.URL.Path,
		IdempotencyKey: r.Header.Get("Idempotency-Key"),
		Body:           body,
		Header:         r.Header.Clone(),
		At:             time.Now(),
	}
	parseErr := wf.parse(&call)
	if parseErr == nil {
		call.Fake, parseErr = fakeOf(r.Header)
	}

	// With Dedup, the first request for a key owns it until it is answered
	// (held requests included): others get 409 meanwhile.
	key := call.IdempotencyKey
	owner := false
	s.mu.Lock()
	s.calls = append(s.calls, call)
	s.active++
	s.maxActive = max(s.maxActive, s.active)
	latency := s.latency
	holds := s.matchingHolds(call)
	if s.dedup && key != "" {
		owner = s.claim(key)
	}
	s.mu.Unlock()
	// A request stops counting as in flight just before its answer (a
	// stream's last event) is written, so a client's next request never
	// finds it still counted.
	finish := sync.OnceFunc(func() {
		s.mu.Lock()
		s.active--
		if owner {
			delete(s.inFlight, key)
		}
		s.mu.Unlock()
	})
	defer finish()
	reply := func(status int, body []byte) {
		finish()
		writeJSON(w, status, body)
	}

	var midway []*Hold // holds that stop a streamed answer after some deltas
	for _, h := range holds {
		if h.after > 0 && call.Stream && parseErr == nil {
			midway = append(midway, h)
			continue
		}
		if !h.hold(r.Context(), s.closing, call) {
			// The client went away or the server is closing: no answer.
			if r.Context().Err() != nil {
				s.record(&s.abandoned, call)
			}
			dropConn(w)
			return
		}
	}

	if parseErr != nil {
		reply(http.StatusBadRequest, wf.fail(http.StatusBadRequest, "fake provider: "+parseErr.Error()))
		return
	}

	s.mu.Lock()
	f := s.takeFault(call)
	s.mu.Unlock()
	if f != nil {
		if f.status == 0 {
			dropConn(w)
			return
		}
		for k, vs := range f.header {
			w.Header()[k] = vs
		}
		reply(f.status, wf.fail(f.status, fmt.Sprintf("fake provider: scripted failure (HTTP %d)", f.status)))
		return
	}
	s.mu.Lock()
	status := s.takeScriptedFailure(call)
	s.mu.Unlock()
	if status != 0 {
		reply(status, wf.fail(status, fmt.Sprintf("fake provider: the workflow's fake block fails this request (HTTP %d)", status)))
		return
	}

	s.mu.Lock()
	dedup := s.dedup && key != ""
	if dedup {
		if a, ok := s.answers[key]; ok {
			pace := s.pace
			s.mu.Unlock()
			s.write(w, r, wf, call, a, pace, midway, finish)
			return
		}
		if !owner {
			if owner = s.claim(key); !owner {
				s.mu.Unlock()
				reply(http.StatusConflict, wf.fail(http.StatusConflict,
					"fake provider: another request with this idempotency key is in progress"))
				return
			}
		}
	}
	responder := s.responder
	s.seq++
	id := s.seq
	pace := s.pace
	s.mu.Unlock()

	if latency > 0 {
		t := time.NewTimer(latency)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			s.record(&s.abandoned, call)
			return
		case <-s.closing:
			t.Stop()
			dropConn(w)
			return
		}
	}
	rep, ok := scripted(call)
	switch {
	case ok:
	case responder != nil:
		rep = responder(call)
	default:
		rep = Reply{Text: "echo: " + call.LastUser()}
	}
	a := answer{status: http.StatusOK, reply: withUsage(call, rep), id: id}
	if rep.Status != 0 && rep.Status != http.StatusOK {
		a = answer{status: rep.Status, body: wf.fail(rep.Status, fmt.Sprintf("fake provider: scripted reply (HTTP %d)", rep.Status))}
	}

	if dedup && a.status == http.StatusOK {
		// Kept before it is written: a request that repeats the key while
		// this answer streams (its client gone) gets the same answer.
		s.mu.Lock()
		s.answers[key] = a
		s.mu.Unlock()
	}
	end := finish
	if a.status == http.StatusOK {
		end = func() {
			s.record(&s.answered, call)
			finish()
		}
	}
	s.write(w, r, wf, call, a, pace, midway, end)
}

// claim marks key as being answered, unless it is answered or being
// answered already; it reports whether it did. s.mu is held.
func (s *Server) claim(key string) bool {
	if _, ok := s.answers[key]; ok {
		return false
	}
	if _, busy := s.inFlight[key]; busy {
		return false
	}
	s.inFlight[key] = struct{}{}
	return true
}

// matchingHolds returns the unreleased holds that match c. s.mu is held.
func (s *Server) matchingHolds(c Call) []*Hold {
	var out []*Hold
	for _, h := range s.holds {
		if h.matches(c) {
			out = append(out, h)
		}
	}
	return out
}

// takeFault returns the first FailNext or Drop rule that matches c, using
// one of its turns. s.mu is held.
func (s *Server) takeFault(c Call) *fault {
	for i, f := range s.faults {
		if f.match != nil && !f.match(c) {
			continue
		}
		f.left--
		if f.left == 0 {
			s.faults = append(s.faults[:i:i], s.faults[i+1:]...)
		}
		return f
	}
	return nil
}
