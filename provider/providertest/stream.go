package providertest

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// write sends answer a to the request: an error answer as JSON, a reply as
// JSON or, when the call asked for a stream, as server-sent events. end
// runs just before the answer's last bytes are written.
func (s *Server) write(w http.ResponseWriter, r *http.Request, wf wire, c Call, a answer, pace time.Duration, midway []*Hold, end func()) {
	switch {
	case a.status != http.StatusOK:
		end()
		writeJSON(w, a.status, a.body)
	case c.Stream:
		if !s.writeStream(w, r, wf.frames(c, a.reply, a.id), c, pace, midway, end) && r.Context().Err() != nil {
			s.record(&s.abandoned, c)
		}
	default:
		end()
		writeJSON(w, http.StatusOK, wf.reply(c, a.reply, a.id))
	}
}

// writeStream writes frames as server-sent events, each flushed as it is
// written: delta frames pace apart, and once the deltas of a midway hold
// are out, it waits for that hold; end runs before the last frame. A
// client that goes away, or the server closing, ends the stream where it
// is: writeStream reports whether it wrote the whole stream.
func (s *Server) writeStream(w http.ResponseWriter, r *http.Request, frames []frame, c Call, pace time.Duration, midway []*Hold, end func()) bool {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	s.mu.Lock()
	observe := s.onDelta
	s.mu.Unlock()
	deltas := 0
	for i, f := range frames {
		if f.delta {
			if deltas > 0 && pace > 0 && !s.sleep(r, pace) {
				return false
			}
			for _, h := range midway {
				if h.after == deltas && !h.hold(r.Context(), s.closing, c) {
					dropConn(w)
					return false
				}
			}
			deltas++
		}
		last := i == len(frames)-1
		if last {
			end()
		}
		var b bytes.Buffer
		if f.event != "" {
			fmt.Fprintf(&b, "event: %s\n", f.event)
		}
		fmt.Fprintf(&b, "data: %s\n\n", f.data)
		if _, err := w.Write(b.Bytes()); err != nil {
			return last
		}
		if f.delta && observe != nil {
			observe(c, deltas-1)
		}
		if rc.Flush() != nil {
			return last
		}
	}
	return true
}

// sleep waits d, and reports false when the client went away or the server
// is closing first.
func (s *Server) sleep(r *http.Request, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-r.Context().Done():
		return false
	case <-s.closing:
		return false
	}
}

// withUsage fills in the word-count usage that r leaves at zero.
func withUsage(c Call, r Reply) Reply {
	if r.InputTokens == 0 {
		n := words(c.System)
		for _, m := range c.Messages {
			n += words(m.Content)
		}
		r.InputTokens = int64(n)
	}
	if r.OutputTokens == 0 {
		r.OutputTokens = int64(words(r.Text) + words(r.Reasoning))
	}
	return r
}

func words(s string) int { return len(strings.Fields(s)) }

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", fmt.Sprint(len(body)))
	w.WriteHeader(status)
	_, _ = io.Copy(w, bytes.NewReader(body))
}

// dropConn closes the request's connection without writing an answer.
func dropConn(w http.ResponseWriter) {
	// The server speaks HTTP/1.1 only, so the connection can be hijacked.
	if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
		_ = conn.Close()
	}
}
