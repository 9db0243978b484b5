package eventstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// errNoMessages: a batched Direct Get matched nothing.
var errNoMessages = errors.New("no messages")

// directRequest is a batched Direct Get (ADR-31): the next messages on a
// subject from a sequence, or the last message of each of several subjects.
type directRequest struct {
	Seq          uint64   `json:"seq,omitempty"`
	LastBySubj   string   `json:"last_by_subj,omitempty"`
	NextBySubj   string   `json:"next_by_subj,omitempty"`
	Batch        int      `json:"batch,omitempty"`
	MaxBytes     int      `json:"max_bytes,omitempty"`
	MultiLastFor []string `json:"multi_last,omitempty"`
	UpToSeq      uint64   `json:"up_to_seq,omitempty"`
}

// directMsg is one message of a batched Direct Get reply.
type directMsg struct {
	Subject  string
	Sequence uint64
	Header   nats.Header
	Data     []byte
}

// directBatch sends a batched Direct Get to stream and passes each
// message of the reply to fn, in order, until the server's end-of-batch
// marker; at most max messages come back. The reply inbox's channel holds
// exactly that many (a few KiB), where a synchronous subscription would
// allocate nats.go's default 64Ki-slot channel (512 KiB) per read.
// Errors: errNoMessages when nothing matched; errIncompleteBatch when the
// reply ended (ctx, the request timeout) before its marker; fn's.
func (s *Store) directBatch(ctx context.Context, stream string, req directRequest, max int, fn func(directMsg) error) error {
	fn = s.counted(stream, fn)
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	nc := s.js.Conn()
	ch := make(chan *nats.Msg, max+2)
	inbox := nc.NewRespInbox()
	sub, err := nc.ChanSubscribe(inbox, ch)
	if err != nil {
		return err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishMsg(&nats.Msg{Subject: s.apiPrefix + "DIRECT.GET." + stream, Reply: inbox, Data: body}); err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	for {
		var m *nats.Msg
		select {
		case m = <-ch:
		case <-rctx.Done():
			if err := ctx.Err(); err != nil {
				return err
			}
			return errIncompleteBatch
		}
		if done, err := directReply(m, fn); done || err != nil {
			return err
		}
	}
}

// directOne is directBatch for a batch of one (req.Batch 1), sent as a
// request over the connection's shared reply subscription: no
// subscription of its own to make and remove. The message's reply is the
// only one it takes; the end-of-batch marker after it finds no request
// waiting and is dropped.
func (s *Store) directOne(ctx context.Context, stream string, req directRequest, _ int, fn func(directMsg) error) error {
	fn = s.counted(stream, fn)
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	m, err := s.js.Conn().RequestMsgWithContext(rctx, &nats.Msg{Subject: s.apiPrefix + "DIRECT.GET." + stream, Data: body})
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return nats.ErrNoResponders
	case err != nil && ctx.Err() != nil:
		return ctx.Err()
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout):
		return errIncompleteBatch
	case err != nil:
		return err
	}
	_, err = directReply(m, fn)
	return err
}

// directReply takes one message of a batched Direct Get reply: a status
// (done: the end of the batch, or an error) or a stored message for fn.
func directReply(m *nats.Msg, fn func(directMsg) error) (done bool, _ error) {
	if len(m.Data) == 0 && m.Header.Get("Status") != "" {
		switch m.Header.Get("Status") {
		case "204": // end of batch
			return true, nil
		case "404":
			return true, errNoMessages
		case "408":
			return true, errIncompleteBatch
		case "503":
			return true, nats.ErrNoResponders
		default:
			return true, fmt.Errorf("direct get: status %s %s", m.Header.Get("Status"), m.Header.Get("Description"))
		}
	}
	seq, perr := strconv.ParseUint(served(m.Header, jetstream.SequenceHeader), 10, 64)
	if perr != nil {
		return true, fmt.Errorf("direct get: bad %s header %q", jetstream.SequenceHeader, served(m.Header, jetstream.SequenceHeader))
	}
	return false, fn(directMsg{Subject: served(m.Header, jetstream.SubjectHeader), Sequence: seq, Header: m.Header, Data: m.Data})
}

// served is the server's own value of one of the headers it adds to an
// answer: the last, as it appends them after the stored message's own. A
// stored message that carries one too (a stored answer, StampOf) must not
// change where the read stands.
func served(h nats.Header, key string) string {
	vs := h.Values(key)
	if len(vs) == 0 {
		return ""
	}
	return vs[len(vs)-1]
}

// apiPrefix is the subject prefix of the JetStream API js talks to.
func apiPrefix(o jetstream.JetStreamOptions) string {
	switch {
	case o.APIPrefix != "":
		return strings.TrimSuffix(o.APIPrefix, ".") + "."
	case o.Domain != "":
		return "$JS." + o.Domain + ".API."
	}
	return "$JS.API."
}
