package natsauth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// MaxClientConsumers bounds the consumers the client account holds on each
// stream it may consume (the guard's count; PAL's own consumers are not
// counted and never refused).
const MaxClientConsumers = 200

// MaxClientInactive bounds how long a client's consumer lives unused: the
// inactive threshold nats.go gives an ordered consumer.
const MaxClientInactive = 5 * time.Minute

// ClientMetadata is the metadata key that marks a consumer the guard made;
// its value is the user that asked for it.
const ClientMetadata = "pal_client"

// Guard makes the client account's consumers. The client account imports
// $JS.API.CONSUMER.CREATE.<stream>[.…] from GuardPrefix, not from the
// JetStream API, because a create's body decides what NATS cannot check
// by subject: a durable consumer would last for ever, a direct or
// sourcing one is not counted by any JetStream limit, and a push
// consumer's deliver subject is published on by the server itself in
// PAL's account, where pal.events.<run>, PAL_WORK's acks and PAL's
// inboxes are. The guard refuses those, forwards the rest to the
// JetStream API (as a create, never an update), and answers with the
// server's answer: an ephemeral consumer that delivers, if it pushes,
// only to the client's inbox (exported to the client account), lives at
// most MaxClientInactive unused, and is one of at most MaxClientConsumers
// on its stream.
type Guard struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	timeout time.Duration
}

// NewGuard returns a guard that creates consumers over nc, a connection of
// PAL's account (the api or worker role).
func NewGuard(nc *nats.Conn) (*Guard, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	return &Guard{nc: nc, js: js, timeout: 10 * time.Second}, nil
}

// createRequest is the JetStream API's consumer create request, its
// fields kept as sent so nothing the guard does not read is lost.
type createRequest map[string]json.RawMessage

// apiError is a JetStream API error answer.
type apiError struct {
	Type  string `json:"type"`
	Error struct {
		Code        int    `json:"code"`
		ErrCode     int    `json:"err_code"`
		Description string `json:"description"`
	} `json:"error"`
}

// Error codes of the JetStream API the guard answers with.
const (
	errCodeCreate      = 10012 // consumer create error: a refused config
	errCodeMaxLimit    = 10026 // maximum consumers limit reached
	errCodeUnavailable = 10008 // JetStream system temporarily unavailable
)

// GuardRefusal is the guard's answer to a create it refuses for why.
func GuardRefusal(why string) []byte { return apiErr(403, errCodeCreate, "PAL: "+why) }

func apiErr(status, code int, desc string) []byte {
	var a apiError
	a.Type = "io.nats.jetstream.api.v1.consumer_create_response"
	a.Error.Code, a.Error.ErrCode, a.Error.Description = status, code, desc
	b, _ := json.Marshal(a)
	return b
}

// Create answers one consumer create sent to subject
// (GuardPrefix+"CONSUMER.CREATE.<stream>[.…]") with body by the client
// user user (Users.Requester): the JetStream API's answer, or a refusal
// in its form.
func (g *Guard) Create(ctx context.Context, subject, user string, body []byte) []byte {
	tail, ok := strings.CutPrefix(subject, GuardPrefix+"CONSUMER.CREATE.")
	stream, _, _ := strings.Cut(tail, ".")
	if !ok || !consumable(stream) {
		return apiErr(400, errCodeCreate, fmt.Sprintf("PAL: clients may not create consumers on %q", clip(stream, 64)))
	}
	fwd, err := checkCreate(body, user)
	if err != nil {
		return apiErr(400, errCodeCreate, "PAL: "+err.Error())
	}
	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	n, err := g.clientConsumers(ctx, stream)
	if err != nil {
		return apiErr(503, errCodeUnavailable, "PAL: counting the consumers of "+stream+": "+err.Error())
	}
	if n >= MaxClientConsumers {
		return apiErr(400, errCodeMaxLimit, fmt.Sprintf("maximum consumers limit reached (%d consumers of clients on %s)", MaxClientConsumers, stream))
	}
	m, err := g.nc.RequestWithContext(ctx, jsAPI+"CONSUMER.CREATE."+tail, fwd)
	if err != nil {
		return apiErr(503, errCodeUnavailable, "PAL: creating the consumer: "+err.Error())
	}
	return m.Data
}

func consumable(stream string) bool {
	for _, s := range consumeStreams {
		if s == stream {
			return true
		}
	}
	return false
}

// clientConsumers counts the consumers on stream the guard made.
func (g *Guard) clientConsumers(ctx context.Context, stream string) (int, error) {
	st, err := g.js.Stream(ctx, stream)
	if err != nil {
		return 0, err
	}
	n := 0
	l := st.ListConsumers(ctx)
	for info := range l.Info() {
		if info.Config.Metadata[ClientMetadata] != "" {
			n++
		}
	}
	return n, l.Err()
}

// checkCreate checks a create request's config and returns the request to
// forward: a create (never an update of a consumer that exists) marked
// with the user.
func checkCreate(body []byte, user string) ([]byte, error) {
	var req createRequest
	if err := json.Unmarshal(body, &req); err != nil || req == nil {
		return nil, errors.New("the request is not a JSON object")
	}
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal(req["config"], &cfg); err != nil || cfg == nil {
		return nil, errors.New("the request has no config object")
	}
	str := func(k string) string {
		var s string
		_ = json.Unmarshal(cfg[k], &s)
		return s
	}
	flag := func(k string) bool {
		var b bool
		_ = json.Unmarshal(cfg[k], &b)
		return b
	}
	var inactive time.Duration
	if raw, ok := cfg["inactive_threshold"]; ok {
		if err := json.Unmarshal(raw, &inactive); err != nil {
			return nil, errors.New("inactive_threshold is not a number of nanoseconds")
		}
	}
	deliver := str("deliver_subject")
	switch {
	case str("durable_name") != "":
		return nil, errors.New("clients make ephemeral consumers only (no durable_name): ordered consumers, nats sub --stream, nats kv watch")
	case flag("direct") || flag("sourcing"):
		return nil, errors.New("direct and sourcing consumers are for streams, not clients")
	case str("deliver_group") != "":
		return nil, errors.New("no deliver_group: a client's push consumer delivers to its own inbox")
	case deliver != "" && !inboxSubject(deliver):
		return nil, fmt.Errorf("deliver_subject %q: a push consumer delivers only to the client's inbox (_INBOX.…)", clip(deliver, 64))
	case inactive > MaxClientInactive:
		return nil, fmt.Errorf("inactive_threshold %s: at most %s", inactive, MaxClientInactive)
	}
	md := map[string]string{}
	if raw, ok := cfg["metadata"]; ok {
		if err := json.Unmarshal(raw, &md); err != nil {
			return nil, errors.New("metadata is not an object of strings")
		}
	}
	md[ClientMetadata] = user
	var err error
	if cfg["metadata"], err = json.Marshal(md); err != nil {
		return nil, err
	}
	if req["config"], err = json.Marshal(cfg); err != nil {
		return nil, err
	}
	req["action"] = json.RawMessage(`"create"`)
	return json.Marshal(req)
}

// inboxSubject reports whether s is a literal subject under _INBOX.
func inboxSubject(s string) bool {
	rest, ok := strings.CutPrefix(s, "_INBOX.")
	if !ok || rest == "" || len(s) > 255 || strings.ContainsAny(s, "*> \t\r\n") {
		return false
	}
	for _, tok := range strings.Split(rest, ".") {
		if tok == "" {
			return false
		}
	}
	return true
}
