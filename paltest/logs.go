package paltest

import (
	"strings"
	"sync"
	"testing"
	"time"
)

// LogCapture keeps log lines (it is an io.Writer for a slog handler) so a
// test can await one.
type LogCapture struct {
	mu      sync.Mutex
	buf     strings.Builder
	changed chan struct{}
}

// NewLogCapture returns an empty capture.
func NewLogCapture() *LogCapture { return &LogCapture{changed: make(chan struct{})} }

func (l *LogCapture) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	close(l.changed)
	l.changed = make(chan struct{})
	return len(p), nil
}

// String returns everything captured so far.
func (l *LogCapture) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// Wait blocks up to 30 s until the logs contain s.
func (l *LogCapture) Wait(tb testing.TB, s string) {
	tb.Helper()
	timeout := time.After(30 * time.Second)
	for {
		l.mu.Lock()
		found, changed := strings.Contains(l.buf.String(), s), l.changed
		l.mu.Unlock()
		if found {
			return
		}
		select {
		case <-changed:
		case <-timeout:
			tb.Fatalf("no log line with %q; logs:\n%s", s, l.String())
		}
	}
}
