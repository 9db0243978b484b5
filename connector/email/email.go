// Package email is PAL's email connector: it sends one message over SMTP
// to the server PAL_SMTP_URL names and returns the server's acceptance as a
// receipt.
//
// Invariant: one call to Deliver opens one SMTP session and sends at most one
// message. PAL's journal decides about retries, as for webhooks.
//
// The server: smtp://user:pass@host:port uses STARTTLS when the server
// offers it (opportunistic; port 587 when none is given), smtps://… speaks
// TLS from the first byte (port 465 by default). User and password, when
// present, authenticate with the best mechanism the server offers.
//
// Every message carries:
//
//	Message-ID:      <IDEMPOTENCY_KEY@pal>  (see MessageID; a receiver can dedupe on it)
//	Idempotency-Key: <delivery key>
//	Pal-Run-Id:      <run id>
//	Pal-Step-Id:     <step id>
//
// Outside input is bounded before anything is sent: the subject and the
// address lists may hold no control characters (a CR or LF would inject
// headers), from is one address, to and cc at most MaxRecipients addresses
// together, the subject at most MaxSubject bytes and text plus html at most
// MaxBody bytes. A refusal is a permanent *connector.Error.
//
// Outcomes: an accepted message is a Receipt with Status 250. Failures are
// *connector.Error values:
//
//   - refused by the egress policy, bad message, or a permanent (5xx) reply
//     to MAIL, RCPT or DATA: permanent.
//   - connect, greeting, STARTTLS or AUTH failed, or a transient (4xx)
//     reply before the message was sent: Retryable.
//   - the connection failed while or after the message was sent: Retryable
//     and Unknown (the server may have accepted it).
//   - ctx cancelled: wraps context.Canceled, not Retryable.
//
// The SMTP host passes the egress policy like a webhook's host: by default
// loopback and private addresses are refused; PAL_EGRESS_ALLOW opens them.
package email

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/mail"
	"net/url"
	"strconv"
	"strings"
	"time"

	gomail "github.com/wneessen/go-mail"

	"github.com/palrun/pal/connector"
	"github.com/palrun/pal/internal/egress"
)

// Kind is the connector kind used in workflows.
const Kind = "email"

// EnvURL names the SMTP server.
const EnvURL = "PAL_SMTP_URL"

// DefaultTimeout bounds one delivery, from dialling to the server's answer.
const DefaultTimeout = 30 * time.Second

// Bounds on a message.
const (
	MaxSubject     = 998 // RFC 5322's line length
	MaxAddressList = 8 << 10
	MaxRecipients  = 100
	MaxBody        = 1 << 20 // text plus html
)

// MessageID returns the Message-ID (without angle brackets) of the message
// sent under an idempotency key: the same key gives the same id, so a
// receiver can drop a duplicate.
func MessageID(key string) string { return key + "@pal" }

// Server is a parsed PAL_SMTP_URL.
type Server struct {
	Host     string
	Port     int
	Implicit bool // smtps: TLS from the first byte
	User     string
	Password string
}

// ParseURL reads smtp://[user:pass@]host[:port] or smtps://…
func ParseURL(s string) (*Server, error) {
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("%s does not parse: %w", EnvURL, unwrapURLError(err))
	}
	srv := &Server{Host: u.Hostname()}
	switch u.Scheme {
	case "smtp":
		srv.Port = 587
	case "smtps":
		srv.Port, srv.Implicit = 465, true
	default:
		return nil, fmt.Errorf("%s scheme %q is not allowed; use smtp://user:pass@host:port or smtps://…", EnvURL, u.Scheme)
	}
	if srv.Host == "" {
		return nil, fmt.Errorf("%s has no host; use smtp://user:pass@host:port", EnvURL)
	}
	if p := u.Port(); p != "" {
		if srv.Port, err = strconv.Atoi(p); err != nil || srv.Port < 1 || srv.Port > 65535 {
			return nil, fmt.Errorf("%s port %q is not a port number", EnvURL, p)
		}
	}
	if u.User != nil {
		srv.User = u.User.Username()
		srv.Password, _ = u.User.Password()
	}
	return srv, nil
}

// Email sends messages over SMTP. It is safe for concurrent use.
type Email struct {
	server  *Server
	err     error // why there is no server
	timeout time.Duration
	egress  *egress.Policy
	tls     *tls.Config
}

// Option configures an Email.
type Option func(*Email)

// WithTimeout bounds each delivery; a non-positive d keeps DefaultTimeout.
func WithTimeout(d time.Duration) Option {
	return func(e *Email) {
		if d > 0 {
			e.timeout = d
		}
	}
}

// WithEgress sets what the connector may connect to. Nil (the default)
// refuses every non-public address.
func WithEgress(p *egress.Policy) Option { return func(e *Email) { e.egress = p } }

// WithTLSConfig sets the TLS configuration for STARTTLS and smtps (tests
// pass their own root CAs). ServerName defaults to the host.
func WithTLSConfig(c *tls.Config) Option { return func(e *Email) { e.tls = c } }

// New returns an email connector for the server smtpURL names. An empty or
// invalid URL still gives a connector, whose every delivery fails
// permanently with the reason, so a worker without PAL_SMTP_URL still runs
// workflows that send no email; Check reports the reason at start.
func New(smtpURL string, opts ...Option) *Email {
	e := &Email{timeout: DefaultTimeout}
	if smtpURL == "" {
		e.err = fmt.Errorf("%s is not set; set it to smtp://user:pass@host:port to send email", EnvURL)
	} else {
		e.server, e.err = ParseURL(smtpURL)
	}
	for _, opt := range opts {
		opt(e)
	}
	return e
}

// Check returns why the connector cannot send, or nil.
func (e *Email) Check() error { return e.err }

// Kind returns "email".
func (e *Email) Kind() string { return Kind }

// Deliver sends d's message once.
func (e *Email) Deliver(ctx context.Context, d connector.Delivery) (*connector.Receipt, error) {
	if e.err != nil {
		return nil, &connector.Error{Connector: Kind, Err: e.err}
	}
	msg, err := Build(d)
	if err != nil {
		return nil, &connector.Error{Connector: Kind, Err: err}
	}
	where := fmt.Sprintf("SMTP to %s", net.JoinHostPort(e.server.Host, strconv.Itoa(e.server.Port)))
	client, err := e.client()
	if err != nil {
		return nil, &connector.Error{Connector: Kind, Err: fmt.Errorf("%s: %w", where, err)}
	}
	ctx, cancel := context.WithTimeout(ctx, e.timeout)
	defer cancel()
	sc, err := client.DialToSMTPClientWithContext(ctx)
	if err != nil {
		return nil, dialError(ctx, where, err)
	}
	err = client.SendWithSMTPClient(sc, msg)
	// The message was accepted or not by now; a failed QUIT changes neither.
	_ = client.CloseWithSMTPClient(sc)
	if err != nil {
		return nil, sendError(ctx, where, err)
	}
	return &connector.Receipt{Status: 250, Body: []byte(`{"message_id":"<` + MessageID(d.IdempotencyKey) + `>"}`)}, nil
}

func (e *Email) client() (*gomail.Client, error) {
	s := e.server
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if e.tls != nil {
		cfg = e.tls.Clone()
	}
	if cfg.ServerName == "" {
		cfg.ServerName = s.Host
	}
	dial := e.egress.Dial((&net.Dialer{}).DialContext, nil)
	if s.Implicit {
		plain := dial
		dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := plain(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			tc := tls.Client(conn, cfg)
			if err := tc.HandshakeContext(ctx); err != nil {
				_ = conn.Close()
				return nil, err
			}
			return tc, nil
		}
	}
	opts := []gomail.Option{
		gomail.WithPort(s.Port),
		gomail.WithTimeout(e.timeout),
		gomail.WithDialContextFunc(gomail.DialContextFunc(dial)),
		gomail.WithTLSConfig(cfg),
		gomail.WithTLSPolicy(gomail.TLSOpportunistic),
		gomail.WithoutNoop(),
	}
	if s.Implicit {
		opts = append(opts, gomail.WithTLSPolicy(gomail.NoTLS)) // already TLS
	}
	if s.User != "" {
		opts = append(opts, gomail.WithSMTPAuth(gomail.SMTPAuthAutoDiscover),
			gomail.WithUsername(s.User), gomail.WithPassword(s.Password))
	}
	return gomail.NewClient(s.Host, opts...)
}

// Build checks d's message against the bounds and returns it with PAL's
// headers. It sends nothing.
func Build(d connector.Delivery) (*gomail.Msg, error) {
	if d.IdempotencyKey == "" {
		return nil, errors.New("delivery has no idempotency key; PAL sends one with every external call")
	}
	m := d.Email
	if m == nil {
		return nil, errors.New("delivery has no email message")
	}
	if err := headerSafe("subject", m.Subject, MaxSubject); err != nil {
		return nil, err
	}
	from, err := addresses("from", m.From)
	if err != nil {
		return nil, err
	}
	if len(from) != 1 {
		return nil, fmt.Errorf("from must be one address, got %d", len(from))
	}
	to, err := addresses("to", m.To)
	if err != nil {
		return nil, err
	}
	if len(to) == 0 {
		return nil, errors.New("to is empty; an email needs at least one recipient")
	}
	var cc []*mail.Address
	if strings.TrimSpace(m.Cc) != "" {
		if cc, err = addresses("cc", m.Cc); err != nil {
			return nil, err
		}
	}
	if n := len(to) + len(cc); n > MaxRecipients {
		return nil, fmt.Errorf("%d recipients in to and cc; at most %d", n, MaxRecipients)
	}
	if m.Text == "" && m.HTML == "" {
		return nil, errors.New("the email has neither text nor html")
	}
	if n := len(m.Text) + len(m.HTML); n > MaxBody {
		return nil, fmt.Errorf("text and html are %d bytes; at most %d", n, MaxBody)
	}

	msg := gomail.NewMsg()
	msg.FromMailAddress(from[0])
	msg.ToMailAddress(to...)
	if len(cc) > 0 {
		msg.CcMailAddress(cc...)
	}
	msg.Subject(m.Subject)
	msg.SetMessageIDWithValue(MessageID(d.IdempotencyKey))
	msg.SetDate()
	msg.SetGenHeader(connector.HeaderIdempotencyKey, d.IdempotencyKey)
	if d.RunID != "" {
		msg.SetGenHeader(connector.HeaderRunID, d.RunID)
	}
	if d.StepID != "" {
		msg.SetGenHeader(connector.HeaderStepID, d.StepID)
	}
	switch {
	case m.Text != "" && m.HTML != "":
		msg.SetBodyString(gomail.TypeTextPlain, m.Text)
		msg.AddAlternativeString(gomail.TypeTextHTML, m.HTML)
	case m.Text != "":
		msg.SetBodyString(gomail.TypeTextPlain, m.Text)
	default:
		msg.SetBodyString(gomail.TypeTextHTML, m.HTML)
	}
	return msg, nil
}

// headerSafe refuses a header value with control characters (CR and LF
// would start a new header) or longer than max bytes.
func headerSafe(field, v string, max int) error {
	if len(v) > max {
		return fmt.Errorf("%s is %d bytes; at most %d", field, len(v), max)
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < ' ' || c == 0x7f {
			return fmt.Errorf("%s contains a control character (%q at byte %d); CR and LF are refused so nothing can add a header", field, c, i)
		}
	}
	return nil
}

// addresses parses an RFC 5322 address list.
func addresses(field, v string) ([]*mail.Address, error) {
	if err := headerSafe(field, v, MaxAddressList); err != nil {
		return nil, err
	}
	if strings.TrimSpace(v) == "" {
		return nil, nil
	}
	list, err := mail.ParseAddressList(v)
	if err != nil {
		return nil, fmt.Errorf("%s is not an address list (want \"a@example.com, Bea <b@example.com>\"): %w", field, err)
	}
	return list, nil
}

// dialError classifies a failure before any message was sent.
func dialError(ctx context.Context, where string, err error) *connector.Error {
	if de := (*egress.DeniedError)(nil); errors.As(err, &de) {
		return &connector.Error{Connector: Kind, Err: fmt.Errorf("%s: %w", where, de)}
	}
	if ce := cancelled(ctx, where, false); ce != nil {
		return ce
	}
	return &connector.Error{Connector: Kind, Retryable: true, Timeout: isTimeout(err),
		Err: fmt.Errorf("%s: could not connect: %w", where, err)}
}

// sendError classifies a failure of the MAIL, RCPT, DATA sequence.
func sendError(ctx context.Context, where string, err error) *connector.Error {
	var se *gomail.SendError
	if !errors.As(err, &se) {
		return &connector.Error{Connector: Kind, Retryable: true, Unknown: true,
			Err: fmt.Errorf("%s: outcome unknown: %w", where, err)}
	}
	switch se.Reason {
	case gomail.ErrGetSender, gomail.ErrGetRcpts, gomail.ErrNoUnencoded:
		return &connector.Error{Connector: Kind, Err: fmt.Errorf("%s: %w", where, err)}
	case gomail.ErrSMTPMailFrom, gomail.ErrSMTPRcptTo, gomail.ErrSMTPData, gomail.ErrSMTPReset:
		// Refused before the message went out: nothing was sent.
		if ce := cancelled(ctx, where, false); ce != nil {
			return ce
		}
		return &connector.Error{Connector: Kind, Status: se.ErrorCode(), Retryable: se.IsTemp() || se.ErrorCode() == 0,
			Err: fmt.Errorf("%s: refused: %w", where, err)}
	}
	// The message was being written or its final reply awaited.
	if code := se.ErrorCode(); code >= 500 {
		return &connector.Error{Connector: Kind, Status: code, Err: fmt.Errorf("%s: message refused: %w", where, err)}
	}
	if ce := cancelled(ctx, where, true); ce != nil {
		return ce
	}
	return &connector.Error{Connector: Kind, Status: se.ErrorCode(), Retryable: true, Unknown: se.ErrorCode() == 0,
		Timeout: isTimeout(err), Err: fmt.Errorf("%s: failed while sending the message: %w", where, err)}
}

func cancelled(ctx context.Context, where string, unknown bool) *connector.Error {
	if ctxErr := ctx.Err(); errors.Is(ctxErr, context.Canceled) {
		return &connector.Error{Connector: Kind, Unknown: unknown, Err: fmt.Errorf("%s: delivery abandoned: %w", where, ctxErr)}
	}
	return nil
}

func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}
