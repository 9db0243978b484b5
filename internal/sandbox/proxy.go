package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"sync"
	"time"
)

// Egress from a sandbox: the init relays each connection made to
// ProxyAddr in the sandbox to the worker's proxy over a Unix socket; the
// proxy takes CONNECT host:port (HTTPS, and any TCP) and absolute-form
// requests for http:// URLs, and dials with the step's DialFunc, which
// refuses what the egress policy refuses. Every connection ends with the
// process.

// maxEgressConns bounds a sandbox's connections through the proxy at once.
const maxEgressConns = 64

// forward runs in the sandbox's init: it listens on addr and relays each
// connection to the Unix socket sock.
func forward(addr, sock string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	sem := make(chan struct{}, maxEgressConns)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			sem <- struct{}{}
			go func() {
				defer func() { <-sem }()
				defer c.Close()
				up, err := net.Dial("unix", sock)
				if err != nil {
					return
				}
				defer up.Close()
				splice(c, up)
			}()
		}
	}()
	return nil
}

// splice copies both ways until either side ends.
func splice(a, b net.Conn) {
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		done <- struct{}{}
	}
	go cp(a, b)
	go cp(b, a)
	<-done
	<-done
}

// egressProxy is the worker's HTTP proxy for one sandbox.
type egressProxy struct {
	srv    *http.Server
	dial   DialFunc
	ctx    context.Context
	cancel context.CancelFunc
	log    *slog.Logger

	mu    sync.Mutex
	conns map[net.Conn]struct{} // tunnels, closed with the proxy
	wg    sync.WaitGroup
}

// serveEgress serves the proxy on ln until close.
func serveEgress(ln net.Listener, dial DialFunc, log *slog.Logger) *egressProxy {
	ctx, cancel := context.WithCancel(context.Background())
	p := &egressProxy{dial: dial, ctx: ctx, cancel: cancel, log: log, conns: map[net.Conn]struct{}{}}
	tr := &http.Transport{DialContext: dial, Proxy: nil, MaxIdleConns: 4, IdleConnTimeout: 30 * time.Second,
		ResponseHeaderTimeout: 5 * time.Minute}
	fwd := &httputil.ReverseProxy{
		Rewrite:   func(pr *httputil.ProxyRequest) { pr.Out.Host = pr.In.Host },
		Transport: tr,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			p.refuse(w, r.Host, err)
		},
	}
	p.srv = &http.Server{ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: 64 << 10,
		BaseContext: func(net.Listener) context.Context { return ctx },
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch {
			case r.Method == http.MethodConnect:
				p.connect(w, r)
			case r.URL.IsAbs() && r.URL.Scheme == "http":
				fwd.ServeHTTP(w, r)
			default:
				http.Error(w, "this is the sandbox's egress proxy: send CONNECT host:port, or an absolute http:// URL", http.StatusBadRequest)
			}
		})}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		_ = p.srv.Serve(limitListener(ln, maxEgressConns))
		tr.CloseIdleConnections()
	}()
	return p
}

func (p *egressProxy) refuse(w http.ResponseWriter, host string, err error) {
	p.log.Info("sandbox egress refused", "host", host, "err", err)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusForbidden)
	fmt.Fprintf(w, "connecting to %s: %v\n", host, err)
}

// connect opens a tunnel to r.Host.
func (p *egressProxy) connect(w http.ResponseWriter, r *http.Request) {
	if p.dial == nil {
		p.refuse(w, r.Host, errors.New("this sandbox has no egress"))
		return
	}
	ctx, cancel := context.WithTimeout(p.ctx, 30*time.Second)
	up, err := p.dial(ctx, "tcp", r.Host)
	cancel()
	if err != nil {
		p.refuse(w, r.Host, err)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		up.Close()
		http.Error(w, "cannot tunnel", http.StatusInternalServerError)
		return
	}
	c, buf, err := hj.Hijack()
	if err != nil {
		up.Close()
		return
	}
	if !p.track(c, up) {
		return
	}
	defer p.untrack(c, up)
	if _, err := c.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n")); err != nil {
		return
	}
	// Bytes the client sent after its CONNECT (a TLS hello) are buffered.
	if n := buf.Reader.Buffered(); n > 0 {
		b, _ := buf.Reader.Peek(n)
		if _, err := up.Write(b); err != nil {
			return
		}
	}
	splice(c, up)
}

// track records a tunnel's two ends; false (and both closed) when the
// proxy is closing.
func (p *egressProxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ctx.Err() != nil {
		for _, c := range cs {
			c.Close()
		}
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *egressProxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		c.Close()
		delete(p.conns, c)
	}
}

// close stops the proxy and ends its connections.
func (p *egressProxy) close() {
	p.mu.Lock()
	p.cancel()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	_ = p.srv.Close()
	p.wg.Wait()
}

// limitListener accepts at most n connections at once.
func limitListener(ln net.Listener, n int) net.Listener {
	return &limited{Listener: ln, sem: make(chan struct{}, n), done: make(chan struct{})}
}

type limited struct {
	net.Listener
	sem  chan struct{}
	done chan struct{}
	once sync.Once
}

func (l *limited) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	return &releaseConn{Conn: c, release: func() { <-l.sem }}, nil
}

func (l *limited) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

type releaseConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *releaseConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// CloseWrite half-closes, so that splice can pass an end of stream on.
func (c *releaseConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
