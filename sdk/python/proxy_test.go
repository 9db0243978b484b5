package python_test

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// cutProxy forwards TCP connections to the REST API, one request each
// (the Python client opens a connection per request). The first event
// stream of a run whose id starts with cutPrefix it cuts short: it
// forwards the answer up to and including the id line of the event with
// seq 3 ("id: 3\n"), then closes both sides, so the client holds events
// 1 and 2 and the start of 3, and must ask again from 2. It records the
// Last-Event-ID of every event stream of such runs.
type cutProxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	cut     bool
	resumes []string // Last-Event-ID of each event stream of a cut- run
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup
}

// cutPrefix starts the ids of the runs whose first event stream is cut.
const cutPrefix = "cut-"

// cutAfter is what the proxy forwards last of the stream it cuts.
var cutAfter = []byte("\nid: 3\n")

// newCutProxy starts a proxy to target (host:port) on 127.0.0.1; it stops
// when the test ends.
func newCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &cutProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		for c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *cutProxy) addr() string { return p.ln.Addr().String() }

// track remembers c, to close it when the test ends.
func (p *cutProxy) track(c net.Conn) {
	p.mu.Lock()
	p.conns[c] = struct{}{}
	p.mu.Unlock()
}

func (p *cutProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.track(c)
		p.wg.Add(1)
		go p.serve(c)
	}
}

// serve forwards one connection: the request as read, then the answer,
// cut short if it is the stream to cut.
func (p *cutProxy) serve(client net.Conn) {
	defer p.wg.Done()
	defer client.Close()
	var head bytes.Buffer
	req, err := http.ReadRequest(bufio.NewReader(io.TeeReader(client, &head)))
	if err != nil {
		return
	}
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	p.track(up)
	defer up.Close()
	cut := false
	if strings.HasPrefix(req.URL.Path, "/v1/runs/"+cutPrefix) && strings.HasSuffix(req.URL.Path, "/events") {
		p.mu.Lock()
		p.resumes = append(p.resumes, req.Header.Get("Last-Event-ID"))
		cut, p.cut = !p.cut, true
		p.mu.Unlock()
	}
	if _, err := up.Write(head.Bytes()); err != nil {
		return
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		_, _ = io.Copy(up, client) // a body the parse did not read
	}()
	if !cut {
		_, _ = io.Copy(client, up)
		return
	}
	var seen []byte
	buf := make([]byte, 4096)
	for {
		n, err := up.Read(buf)
		if n > 0 {
			before := len(seen)
			seen = append(seen, buf[:n]...)
			if i := bytes.Index(seen, cutAfter); i >= 0 {
				_, _ = client.Write(buf[:i+len(cutAfter)-before])
				return
			}
			if _, err := client.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// streams is the Last-Event-ID of each event stream of a cut- run, in
// the order they came.
func (p *cutProxy) streams() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.resumes...)
}
