package runs

import (
	"context"
	"errors"

	"github.com/palrun/pal/event"
)

// ErrThreadNotFound: no record is on the thread's subject (no thread step
// of a run on it has started yet). Classify answers it 404.
var ErrThreadNotFound = errors.New("thread not found")

// ThreadView is a thread's conversation (GET /v1/threads/{id}, pal thread
// get): its turns, oldest first, each with the run and step that wrote
// it and its record's seq; the steps holding it now; its size against
// its bound (docs/architecture.md §7.3).
type ThreadView struct {
	Thread string       `json:"thread"`
	Seq    uint64       `json:"seq"`
	Bytes  int          `json:"bytes"`
	Turns  []event.Turn `json:"turns"`
	Holds  []event.Hold `json:"holds"`
}

// Thread reads thread id from its journal (PAL_THREADS), verified.
// Errors: an *InputError (field thread) for an id that is no thread id,
// ErrThreadNotFound, a corrupt thread's, JetStream's.
func (c *Client) Thread(ctx context.Context, id string) (*ThreadView, error) {
	if err := event.ValidateThreadID(id); err != nil {
		return nil, &InputError{Field: "thread", Msg: err.Error()}
	}
	t, err := c.store.ReadThread(ctx, id)
	if err != nil {
		return nil, err
	}
	if t.Seq == 0 {
		return nil, ErrThreadNotFound
	}
	holds := t.Holds
	if holds == nil {
		holds = []event.Hold{}
	}
	return &ThreadView{Thread: t.ID, Seq: t.Seq, Bytes: t.Bytes, Turns: t.Turns, Holds: holds}, nil
}
