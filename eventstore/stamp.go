package eventstore

import (
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/palrun/pal/event"
)

// How a journal message reached its reader: the server adds its own
// Nats-Stream, Nats-Subject and Nats-Sequence headers to a Direct Get
// answer and to a republished copy (Answered), none to a consumer's
// delivery (Delivered).
const (
	Delivered = 0
	Answered  = 1
)

// answerHeaders are the headers a server's answer carries about the
// stored message it answers with.
var answerHeaders = []string{jetstream.StreamHeader, jetstream.SubjectHeader, jetstream.SequenceHeader}

// StampOf is what a journal message's headers h say of it (event.Stamp),
// for event.Chain.NextStamped: one check, the same in every reader (Read,
// Watch, Scan's callers, the projector). added is how many of each of
// the answer's headers the way it was read adds (Answered, Delivered): a
// message that carries more was itself a server's answer, stored in the
// journal by a responder whose reply subject was aimed there.
func StampOf(h nats.Header, added int) event.Stamp {
	s := event.Stamp{MsgID: h.Get(jetstream.MsgIDHeader), Kinds: h.Get(kindHeader)}
	for _, k := range answerHeaders {
		if n := len(h.Values(k)); n > added {
			s.Echo = fmt.Sprintf("it carries its own %s header", k)
			break
		}
	}
	return s
}
