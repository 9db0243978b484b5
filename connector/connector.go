// Package connector is PAL's seam to external deliveries: webhooks, email and
// other side effects that leave a receipt. A Connector makes one delivery
// attempt; the worker journals around it.
//
// Invariants, the contract with the worker (docs/architecture.md §2
// guarantee 5, §10.5):
//
//   - The worker appends side_effect_claimed before it calls Deliver and
//     side_effect_delivered with the Receipt after. A re-drive that finds the
//     claim does not send again on its own; a connector never retries.
//   - Every Delivery carries an idempotency key derived from
//     sha256("runID|stepID|attempt"). It is sent to the receiver (for a
//     webhook as the Idempotency-Key header) and cannot be replaced by
//     user-supplied headers, so a receiver can drop duplicates.
//   - A failed delivery returns an *Error that says whether it may be retried
//     and whether its outcome is unknown (the request may have reached the
//     receiver: a timeout or a connection cut after sending). A retry after an
//     unknown outcome must reuse the same idempotency key.
//
// Implementations live in connector/webhook and connector/email;
// connector/connectortest has an HTTP and an SMTP receiver for tests that
// record every delivery and can hold, fail or drop them on cue.
package connector

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/palrun/pal/internal/registry"
)

// MaxReceiptBody is the most bytes of a receiver's answer kept in a Receipt.
const MaxReceiptBody = 4 << 10

// Header names PAL sets on every delivery. User-supplied headers may not set
// them.
const (
	HeaderIdempotencyKey = "Idempotency-Key"
	HeaderRunID          = "Pal-Run-Id"
	HeaderStepID         = "Pal-Step-Id"
)

// Delivery is one external delivery, rendered by the worker from a connector
// node.
type Delivery struct {
	RunID  string `json:"run_id"`
	StepID string `json:"step_id"`
	// IdempotencyKey is hex(sha256("runID|stepID|attempt")). Required.
	IdempotencyKey string `json:"idempotency_key"`
	// URL is where the delivery goes (for a webhook, an http or https URL).
	URL string `json:"url"`
	// Method is the HTTP method; empty means POST.
	Method string `json:"method,omitempty"`
	// Headers are extra headers. They may not set the headers PAL owns
	// (Idempotency-Key, Pal-Run-Id, Pal-Step-Id); see ValidateHeaders.
	Headers map[string]string `json:"headers,omitempty"`
	// Body is the JSON payload; empty sends no body.
	Body json.RawMessage `json:"body,omitempty"`
	// Email is the message of an email delivery (URL, Method, Headers and
	// Body are unused then).
	Email *Email `json:"email,omitempty"`
}

// Email is one email message, rendered from an email connector node. To
// and Cc are RFC 5322 address lists ("a@x.test, Bea <b@y.test>"); at least
// one of Text and HTML is set.
type Email struct {
	From    string `json:"from"`
	To      string `json:"to"`
	Cc      string `json:"cc,omitempty"`
	Subject string `json:"subject"`
	Text    string `json:"text,omitempty"`
	HTML    string `json:"html,omitempty"`
}

// Receipt is the receiver's answer to a successful delivery. The worker
// journals it in side_effect_delivered.
type Receipt struct {
	// Status is the HTTP status the receiver answered with (for email, the
	// SMTP reply code of the accepted message, 250).
	Status int `json:"status"`
	// Body is the start of the receiver's answer, at most MaxReceiptBody
	// bytes.
	Body []byte `json:"body,omitempty"`
}

// Connector makes external deliveries.
type Connector interface {
	// Kind is the connector kind used in workflows ("webhook", "email").
	Kind() string
	// Deliver makes one delivery attempt (no retries) and returns the
	// receiver's receipt. Failures are returned as an *Error.
	Deliver(ctx context.Context, d Delivery) (*Receipt, error)
}

// Error is a failed delivery.
type Error struct {
	// Connector is the connector kind ("webhook").
	Connector string
	// Status is the HTTP status, 0 when no answer arrived.
	Status int
	// Retryable reports that trying again may succeed (408, 429, 5xx,
	// timeouts, connection failures).
	Retryable bool
	// Unknown reports that the request may have reached the receiver (a
	// timeout or a connection cut after sending): it may have taken effect,
	// and a retry must reuse the same idempotency key.
	Unknown bool
	// Timeout reports that the delivery ran out of time.
	Timeout bool
	Err     error
}

func (e *Error) Error() string {
	if e.Status != 0 {
		return fmt.Sprintf("%s: HTTP %d: %v", e.Connector, e.Status, e.Err)
	}
	return fmt.Sprintf("%s: %v", e.Connector, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// ErrUnknownConnector is returned by Registry.Get for a kind nobody
// registered.
var ErrUnknownConnector = errors.New("unknown connector kind")

// Registry maps connector kinds to connectors. Get returns an error
// wrapping ErrUnknownConnector for a kind nobody registered.
type Registry = registry.Registry[Connector, connectors]

// connectors is the Kind of a Registry.
type connectors struct{}

func (connectors) Unknown() error { return ErrUnknownConnector }

// ValidateHeaders checks user-supplied delivery headers: names must be valid
// HTTP header names, values may not contain control characters other than
// tab, and none may set a header PAL owns (Idempotency-Key, Pal-Run-Id,
// Pal-Step-Id), in any letter case. Workflow validation can call it to refuse
// such headers before a run starts; connectors call it before sending.
func ValidateHeaders(h map[string]string) error {
	names := make([]string, 0, len(h))
	for name := range h {
		names = append(names, name)
	}
	slices.Sort(names) // report the same header first every time
	for _, name := range names {
		if !validHeaderName(name) {
			return fmt.Errorf("header %q: invalid header name", name)
		}
		switch http.CanonicalHeaderKey(name) {
		case HeaderIdempotencyKey, HeaderRunID, HeaderStepID:
			return fmt.Errorf("header %q is set by PAL and cannot be overridden; remove it from the connector's headers", name)
		}
		if !validHeaderValue(h[name]) {
			return fmt.Errorf("header %q: value contains control characters", name)
		}
	}
	return nil
}

// validHeaderName reports whether name is an RFC 9110 token.
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// validHeaderValue reports whether v has no control characters except tab.
func validHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}
