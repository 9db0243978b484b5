package workers

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
)

// processOutput is the step's output: fd 3, else the last stdout line.
func processOutput(fd3 []byte, stdout *lastLine) (json.RawMessage, error) {
	if len(fd3) > maxProcessOutput {
		return nil, fmt.Errorf("the process wrote more than %d bytes to fd 3", maxProcessOutput)
	}
	if b := bytes.TrimSpace(fd3); len(b) > 0 {
		if !json.Valid(b) {
			return nil, errors.New("the process wrote to fd 3 what is not JSON")
		}
		return b, nil
	}
	line, tooLong := stdout.last()
	if tooLong {
		return nil, fmt.Errorf("the last line of the process's stdout is over %d bytes", maxProcessOutput)
	}
	if len(line) == 0 {
		return json.RawMessage("null"), nil
	}
	if json.Valid(line) {
		return line, nil
	}
	return json.Marshal(string(line))
}

// lastLine keeps the last non-empty line written to it, bounded.
type lastLine struct {
	max      int
	mu       sync.Mutex
	cur      []byte
	curLong  bool
	done     []byte
	doneLong bool
}

func (l *lastLine) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		chunk := p
		if i >= 0 {
			chunk = p[:i]
		}
		if len(l.cur)+len(chunk) > l.max {
			l.curLong = true
		} else if !l.curLong {
			l.cur = append(l.cur, chunk...)
		}
		if i < 0 {
			break
		}
		l.endLine()
		p = p[i+1:]
	}
	return n, nil
}

func (l *lastLine) endLine() {
	if len(bytes.TrimSpace(l.cur)) > 0 || l.curLong {
		l.done, l.doneLong = append(l.done[:0], l.cur...), l.curLong
	}
	l.cur, l.curLong = l.cur[:0], false
}

func (l *lastLine) last() ([]byte, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.endLine()
	return bytes.TrimSpace(l.done), l.doneLong
}

// tail keeps the last max bytes written to it.
type tail struct {
	max int
	mu  sync.Mutex
	buf []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > t.max {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-t.max:]...)
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.ToValidUTF8(string(t.buf), "")
}
