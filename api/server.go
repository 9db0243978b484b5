package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"
)

// DefaultAddr is where the REST API listens when PAL_HTTP_ADDR is unset.
const DefaultAddr = "127.0.0.1:8080"

// Server serves a handler over HTTP on one address.
type Server struct {
	addr    string
	handler http.Handler
	log     *slog.Logger

	mu       sync.Mutex
	srv      *http.Server
	ln       net.Listener
	done     chan struct{}
	serveErr error
}

// NewServer returns a server for handler on addr ("host:port"; port 0
// picks a free one).
func NewServer(addr string, handler http.Handler, log *slog.Logger) *Server {
	if log == nil {
		log = slog.Default()
	}
	return &Server{addr: addr, handler: handler, log: log}
}

// Start listens on the address and serves in the background. Errors: the
// address is taken or not valid.
func (s *Server) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil {
		return errors.New("http server already started")
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", s.addr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", s.addr, err)
	}
	stopping := make(chan struct{})
	base := context.WithValue(context.WithoutCancel(ctx), shutdownKey{}, stopping)
	// HTTP/1.1 for REST and the web, and unencrypted HTTP/2 (prior
	// knowledge) for gRPC clients on the same port.
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	srv := &http.Server{
		Protocols:         &protocols,
		Handler:           s.handler,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       60 * time.Second,
		IdleTimeout:       120 * time.Second,
		// Above the handler's own MaxHeaderBytes, so that it, not Go's
		// plain-text 431, answers headers between the two.
		MaxHeaderBytes: http.DefaultMaxHeaderBytes,
		BaseContext:    func(net.Listener) context.Context { return base },
		// Each request can reach its connection (an event stream bounds
		// its send buffer, sse.go).
		ConnContext: func(ctx context.Context, c net.Conn) context.Context { return context.WithValue(ctx, connKey{}, c) },
		ErrorLog:    slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	var once sync.Once
	srv.RegisterOnShutdown(func() { once.Do(func() { close(stopping) }) })
	s.srv, s.ln, s.done = srv, ln, make(chan struct{})
	go func() {
		defer close(s.done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.mu.Lock()
			s.serveErr = err
			s.mu.Unlock()
			s.log.Error("http server failed", "addr", ln.Addr().String(), "err", err)
		}
	}()
	return nil
}

// Addr returns the address listened on ("" before Start).
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return ""
	}
	return s.ln.Addr().String()
}

// URL returns "http://" + Addr().
func (s *Server) URL() string { return "http://" + s.Addr() }

// Stop stops accepting connections, ends open event streams (their
// clients reconnect with Last-Event-ID) and waits for requests in
// progress, or until ctx ends, then closes what is left. It is
// idempotent.
func (s *Server) Stop(ctx context.Context) error {
	s.mu.Lock()
	srv, done := s.srv, s.done
	s.mu.Unlock()
	if srv == nil {
		return nil
	}
	err := srv.Shutdown(ctx)
	if err != nil {
		_ = srv.Close()
	}
	<-done
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil {
		err = s.serveErr
	}
	return err
}
