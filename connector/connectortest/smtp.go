package connectortest

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"math/big"
	"net"
	"net/mail"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-smtp"
)

// maxMessage is the largest message the SMTP receiver accepts.
const maxMessage = 8 << 20

// Message is one message the SMTP receiver accepted, recorded once its DATA
// was read whole (before a HoldAfterData hold answers it).
type Message struct {
	From string
	To   []string // RCPT TO, in order
	Data []byte
	// Header is Data's parsed header.
	Header mail.Header
	// TLS reports that the session ran over TLS (STARTTLS).
	TLS bool
}

// Stage is where an SMTPHold stops a session.
type Stage int

const (
	// HoldBeforeMail stops a session at MAIL FROM: nothing of the message
	// was sent yet.
	HoldBeforeMail Stage = iota + 1
	// HoldAfterData stops a session after its message was read and
	// recorded, before the server answers 250: the client cannot know the
	// message arrived.
	HoldAfterData
)

// SMTPReceiver is a recording SMTP server on 127.0.0.1. Its methods are safe
// for concurrent use.
type SMTPReceiver struct {
	srv  *smtp.Server
	addr string
	ca   *x509.CertPool

	mu       sync.Mutex
	messages []Message
	holds    []*SMTPHold
	closed   chan struct{}
	once     sync.Once
}

// SMTPOption configures an SMTPReceiver.
type SMTPOption func(*smtpConfig)

type smtpConfig struct{ startTLS bool }

// WithStartTLS makes the receiver offer STARTTLS with a self-signed
// certificate for 127.0.0.1; ClientTLS trusts it.
func WithStartTLS() SMTPOption { return func(c *smtpConfig) { c.startTLS = true } }

// NewSMTPReceiver starts an SMTP receiver that closes when tb's test ends.
func NewSMTPReceiver(tb testing.TB, opts ...SMTPOption) *SMTPReceiver {
	tb.Helper()
	var cfg smtpConfig
	for _, o := range opts {
		o(&cfg)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("connectortest: listening on 127.0.0.1: %v", err)
	}
	r := &SMTPReceiver{addr: l.Addr().String(), closed: make(chan struct{})}
	r.srv = smtp.NewServer(smtp.BackendFunc(func(c *smtp.Conn) (smtp.Session, error) {
		return &smtpSession{r: r, c: c}, nil
	}))
	r.srv.Domain = "127.0.0.1"
	r.srv.MaxMessageBytes = maxMessage
	r.srv.ReadTimeout = time.Minute
	r.srv.WriteTimeout = time.Minute
	r.srv.AllowInsecureAuth = true
	if cfg.startTLS {
		cert, pool, err := selfSigned()
		if err != nil {
			tb.Fatalf("connectortest: certificate: %v", err)
		}
		r.srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		r.ca = pool
	}
	go func() { _ = r.srv.Serve(l) }()
	tb.Cleanup(r.Close)
	return r
}

// URL is smtp://127.0.0.1:<port>.
func (r *SMTPReceiver) URL() string { return "smtp://" + r.addr }

// ClientTLS is a client configuration that trusts the receiver's
// certificate (with WithStartTLS).
func (r *SMTPReceiver) ClientTLS() *tls.Config {
	return &tls.Config{RootCAs: r.ca, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
}

// Close stops the receiver and releases every hold. It is idempotent.
func (r *SMTPReceiver) Close() {
	r.once.Do(func() {
		close(r.closed)
		_ = r.srv.Close()
	})
}

// Messages returns the messages recorded so far, in order.
func (r *SMTPReceiver) Messages() []Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Message(nil), r.messages...)
}

// Count returns how many recorded messages carry Message-ID <id>.
func (r *SMTPReceiver) Count(id string) int {
	n := 0
	for _, m := range r.Messages() {
		if m.Header.Get("Message-Id") == "<"+id+">" {
			n++
		}
	}
	return n
}

// Hold stops the next session that reaches stage until Release.
func (r *SMTPReceiver) Hold(stage Stage) *SMTPHold {
	h := &SMTPHold{stage: stage, arrived: make(chan struct{}), release: make(chan struct{})}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.holds = append(r.holds, h)
	return h
}

// SMTPHold is one session kept waiting; see SMTPReceiver.Hold.
type SMTPHold struct {
	stage   Stage
	arrived chan struct{}
	release chan struct{}
	once    sync.Once
}

// Wait returns once a session has reached the hold's stage.
func (h *SMTPHold) Wait(ctx context.Context) error {
	select {
	case <-h.arrived:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Release lets the held session go on.
func (h *SMTPHold) Release() { h.once.Do(func() { close(h.release) }) }

// stop waits at stage if a hold takes this session.
func (r *SMTPReceiver) stop(stage Stage) {
	r.mu.Lock()
	var h *SMTPHold
	for i, c := range r.holds {
		if c.stage == stage {
			h = c
			r.holds = append(r.holds[:i:i], r.holds[i+1:]...)
			break
		}
	}
	r.mu.Unlock()
	if h == nil {
		return
	}
	close(h.arrived)
	select {
	case <-h.release:
	case <-r.closed:
	}
}

type smtpSession struct {
	r    *SMTPReceiver
	c    *smtp.Conn
	from string
	to   []string
}

func (s *smtpSession) Reset()        { s.from, s.to = "", nil }
func (s *smtpSession) Logout() error { return nil }

func (s *smtpSession) Mail(from string, _ *smtp.MailOptions) error {
	s.r.stop(HoldBeforeMail)
	s.from = from
	return nil
}

func (s *smtpSession) Rcpt(to string, _ *smtp.RcptOptions) error {
	s.to = append(s.to, to)
	return nil
}

func (s *smtpSession) Data(rd io.Reader) error {
	b, err := io.ReadAll(rd)
	if err != nil {
		return err
	}
	msg := Message{From: s.from, To: append([]string(nil), s.to...), Data: b}
	if m, err := mail.ReadMessage(bytes.NewReader(b)); err == nil {
		msg.Header = m.Header
	}
	_, msg.TLS = s.c.TLSConnectionState()
	s.r.mu.Lock()
	s.r.messages = append(s.r.messages, msg)
	s.r.mu.Unlock()
	s.r.stop(HoldAfterData)
	return nil
}

// selfSigned makes a certificate for 127.0.0.1 and a pool that trusts it.
func selfSigned() (tls.Certificate, *x509.CertPool, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "connectortest"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA:         true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool, nil
}
