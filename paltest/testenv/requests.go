package testenv

import (
	"bytes"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"
)

// Requests counts the requests one connection sends: the messages it
// publishes with a reply subject, whose answer its sender waits for (a
// JetStream publish and its ack, an API call, a direct get, a KV write, a
// double ack, a core NATS request). Publishes without a reply (an ack, a
// progress notice, a reply to a request) are not requests.
//
// It counts at the client, as the connection writes the protocol to its
// socket: each request is the path under test's own, with its subject,
// whatever else the server serves at the time.
type Requests struct {
	mu     sync.Mutex
	sent   []string // subjects, in the order written
	ignore []string // subject prefixes not counted
}

// CountRequests connects as Conn does and counts the requests the
// connection sends. A request is counted once the connection has written
// it to its socket: flush the connection (Flush) before reading the
// count.
func (n *NATSServer) CountRequests(tb testing.TB, opts ...nats.Option) (*nats.Conn, *Requests) {
	tb.Helper()
	r := &Requests{}
	nc := n.Conn(tb, append(opts, nats.SetCustomDialer(countingDialer{r: r}))...)
	return nc, r
}

// Ignore stops counting requests whose subject starts with one of
// prefixes: background work (a consumer's pull requests, say) that runs
// on its own schedule, not on the path under test.
func (r *Requests) Ignore(prefixes ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ignore = append(r.ignore, prefixes...)
}

// Mark is how many requests were counted so far: Since(Mark()) is what
// comes after.
func (r *Requests) Mark() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.sent)
}

// Since returns the subjects of the requests counted after mark, in the
// order they were sent.
func (r *Requests) Since(mark int) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.sent[mark:])
}

func (r *Requests) add(subject string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.ignore {
		if strings.HasPrefix(subject, p) {
			return
		}
	}
	r.sent = append(r.sent, subject)
}

// countingDialer dials TCP and counts the requests written on the
// connection.
type countingDialer struct{ r *Requests }

func (d countingDialer) Dial(network, address string) (net.Conn, error) {
	c, err := net.Dial(network, address)
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, r: d.r}, nil
}

// countingConn reads the client protocol as it is written: operations
// are lines; PUB and HPUB are followed by a payload of the size they
// state. nats.go writes under its connection's lock, one writer at a
// time.
type countingConn struct {
	net.Conn
	r    *Requests
	line []byte // the start of an operation not yet ended by its newline
	skip int    // payload bytes (and their CRLF) still to pass over
}

func (c *countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.scan(p[:n])
	return n, err
}

func (c *countingConn) scan(p []byte) {
	for len(p) > 0 {
		if c.skip > 0 {
			k := min(c.skip, len(p))
			c.skip -= k
			p = p[k:]
			continue
		}
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			c.line = append(c.line, p...)
			return
		}
		c.line = append(c.line, p[:i]...)
		p = p[i+1:]
		c.op(strings.Fields(string(c.line)))
		c.line = c.line[:0]
	}
}

// op reads one operation: PUB <subject> [reply] <size>, HPUB <subject>
// [reply] <header size> <total size>.
func (c *countingConn) op(f []string) {
	if len(f) == 0 {
		return
	}
	var withReply int
	switch strings.ToUpper(f[0]) {
	case "PUB":
		withReply = 4
	case "HPUB":
		withReply = 5
	default:
		return
	}
	size, err := strconv.Atoi(f[len(f)-1])
	if err != nil {
		return
	}
	c.skip = size + 2
	if len(f) == withReply {
		c.r.add(f[1])
	}
}
