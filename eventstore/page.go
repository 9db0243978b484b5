package eventstore

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/internal/retry"
)

// The bounds of one page of a paged read (Pages.Next).
const (
	// PageMessages is the most messages one page holds.
	PageMessages = 64
	// PageBytes bounds a page's bytes: the server stops a page once it
	// has sent this much, so a page is at most PageBytes plus one
	// message (a message is never split).
	PageBytes = 16 << 10
)

// Pages reads a run's events after a seq in bounded pages (at most
// PageMessages messages, about PageBytes), so a reader holds a page, not
// the journal, whatever the journal's size. Every message is verified as
// Read does (event.Chain, with its stamp: PAL wrote it), from the message
// before the first one read.
//
// Where it starts costs a few reads, not the journal: the run's last
// message (a reader already at the head reads nothing else), then a
// bisection of the stream's sequences for the first message that holds
// an event after the seq (about log2 of the stream's length, one message
// each), then the message before that one, which the chain continues
// from. A message on the way that is not one of the run's sends the read
// to the start of the journal, where the chain says what is wrong.
//
// A Pages is used by one goroutine.
type Pages struct {
	s      *Store
	runID  string
	after  uint64
	placed bool
	caught bool
	head   Head
	chain  event.Chain
}

// Pages returns a reader of runID's events with seq after after (0: from
// the first). Nothing is read before Next. Errors: an invalid run id.
func (s *Store) Pages(runID string, after uint64) (*Pages, error) {
	if err := checkRunID(runID); err != nil {
		return nil, fmt.Errorf("reading: %w", err)
	}
	return &Pages{s: s, runID: runID, after: after}, nil
}

// Next returns the next page of events, in order, each once. An empty
// page means the reader is at the end of the journal as it stands
// (CaughtUp): a later Next returns what was appended since.
//
// Errors: ErrRunNotFound (the run has no journal); *event.CorruptError
// (matches event.ErrJournalCorrupt) once the read has reached the end of
// a journal that does not verify and no seal follows, with the sound
// events not yet returned; ctx.Err(); JetStream's, after retrying the
// passing ones until ctx ends.
func (p *Pages) Next(ctx context.Context) ([]event.Event, error) {
	if !p.placed {
		if err := p.place(ctx); err != nil {
			return nil, err
		}
		p.placed = true
		if p.caught {
			return nil, nil
		}
	}
	var out []event.Event
	for {
		caught, err := p.read(ctx, &out)
		if err != nil {
			return nil, err
		}
		p.caught = caught
		if caught && p.chain.Corrupt != nil && !p.chain.Sealed {
			return out, p.chain.Corrupt
		}
		if caught || len(out) > 0 {
			return out, nil
		}
	}
}

// CaughtUp reports whether the last Next reached the end of the journal
// as it then stood.
func (p *Pages) CaughtUp() bool { return p.caught }

// Ended reports whether the events read end the run: a terminal event,
// or, for a reader that started at the head, a last message that ends
// with one.
func (p *Pages) Ended() bool { return p.chain.Ended }

// Head returns the head after the last message read: a Watch from it
// misses nothing the reader has not read.
func (p *Pages) Head() Head { return p.head }

// read reads one page after the head into out (the events after p.after)
// and reports whether nothing is pending after it.
func (p *Pages) read(ctx context.Context, out *[]event.Event) (caught bool, err error) {
	subj := EventsSubject(p.runID)
	// A reader that was at the end asks for one message first, over the
	// connection's shared reply subscription (as scan does): most such
	// reads find nothing, and skip the subscription of a longer batch.
	size := PageMessages
	if p.caught {
		size = 1
	}
	err = retry.Do(ctx, jsRetry, func() error {
		// Each message reaches the chain once: a retry starts after the
		// last one it took.
		_, pending, _, err := p.s.readBatch(ctx, subj, p.head.StreamSeq, 0, size, PageBytes, func(streamSeq uint64, body []byte, stamp event.Stamp) bool {
			evs, _ := p.chain.NextStamped(body, stamp) // a bad message is recorded in chain.Corrupt
			p.head = after(&p.chain, streamSeq)
			for _, ev := range evs {
				if ev.Seq > p.after {
					*out = append(*out, ev)
				}
			}
			return true
		})
		if err != nil {
			err = fmt.Errorf("reading run %s: %w", p.runID, err)
			if !transient(err) && !errors.Is(err, errIncompleteBatch) {
				return retry.Permanent(err)
			}
			return err
		}
		caught = pending == 0
		return nil
	})
	return caught, err
}

// place sets where the read starts (see Pages).
func (p *Pages) place(ctx context.Context) error {
	subj := EventsSubject(p.runID)
	last, err := p.get(ctx, directRequest{LastBySubj: subj})
	if err != nil {
		return err
	}
	if last == nil {
		return fmt.Errorf("reading run %s: %w", p.runID, ErrRunNotFound)
	}
	lastEvs, ok := p.decode(last)
	switch {
	case !ok:
		return p.fromStart()
	case lastEvs[len(lastEvs)-1].Seq <= p.after:
		// Nothing to read: stand at the head.
		p.head = Head{Seq: lastEvs[len(lastEvs)-1].Seq, StreamSeq: last.Sequence, Hash: event.Hash(last.Data)}
		p.chain = p.head.chain(p.runID)
		p.chain.Ended, p.caught = lastEvs[len(lastEvs)-1].Kind.Terminal(), true
		return nil
	case p.after == 0:
		return p.fromStart()
	}
	// Bisect for the first message holding an event after p.after: the
	// last message does; the answer is first, at or before it.
	first := last.Sequence
	for lo, hi := uint64(1), last.Sequence-1; lo <= hi; {
		mid := lo + (hi-lo)/2
		m, err := p.get(ctx, directRequest{Seq: mid, NextBySubj: subj})
		if err != nil {
			return err
		}
		if m == nil || m.Sequence >= first {
			hi = mid - 1 // none between mid and first
			continue
		}
		evs, ok := p.decode(m)
		switch {
		case !ok:
			return p.fromStart()
		case evs[len(evs)-1].Seq > p.after:
			first, hi = m.Sequence, mid-1
		default:
			lo = m.Sequence + 1
		}
	}
	// The chain continues from the message before it, so that one's link
	// to it is checked as every later link is.
	prev, err := p.get(ctx, directRequest{MultiLastFor: []string{subj}, UpToSeq: first - 1})
	if err != nil {
		return err
	}
	if prev == nil {
		return p.fromStart() // first is the run's first message
	}
	evs, ok := p.decode(prev)
	if !ok || evs[len(evs)-1].Seq > p.after {
		return p.fromStart()
	}
	p.head = Head{Seq: evs[len(evs)-1].Seq, StreamSeq: prev.Sequence, Hash: event.Hash(prev.Data)}
	p.chain = p.head.chain(p.runID)
	for _, ev := range evs {
		p.chain.Ended = p.chain.Ended || ev.Kind.Terminal()
	}
	return nil
}

// fromStart has the read start at the journal's first message.
func (p *Pages) fromStart() error {
	p.head = Head{}
	p.chain = p.head.chain(p.runID)
	return nil
}

// decode returns m's events if it is a message of the run's (nothing
// more is checked: the chain does that as the pages are read).
func (p *Pages) decode(m *directMsg) ([]event.Event, bool) {
	evs, err := event.Decode(m.Data)
	if err != nil || evs[0].RunID != p.runID {
		return nil, false
	}
	return evs, true
}

// get reads the one message req asks for; nil when there is none.
func (p *Pages) get(ctx context.Context, req directRequest) (*directMsg, error) {
	return retry.Value(ctx, jsRetry, func() (*directMsg, error) {
		var got *directMsg
		err := p.s.directOne(ctx, EventsStream, req, 1, func(m directMsg) error {
			got = &m
			return nil
		})
		switch {
		case errors.Is(err, errNoMessages):
			return nil, nil
		case err != nil:
			err = fmt.Errorf("reading run %s: %w", p.runID, err)
			if !transient(err) && !errors.Is(err, errIncompleteBatch) {
				return nil, retry.Permanent(err)
			}
			return nil, err
		}
		return got, nil
	})
}

// ReadStats counts what a Store has read of the journal (PAL_EVENTS):
// the messages its Direct Gets returned and their bytes.
type ReadStats struct {
	Messages, Bytes uint64
}

// readStats is a Store's ReadStats as it counts them.
type readStats struct {
	messages, bytes atomic.Uint64
}

// ReadStats returns what the store has read of the journal so far.
func (s *Store) ReadStats() ReadStats {
	return ReadStats{Messages: s.reads.messages.Load(), Bytes: s.reads.bytes.Load()}
}

// counted wraps fn, a Direct Get's message handler on stream, to count
// the journal's messages.
func (s *Store) counted(stream string, fn func(directMsg) error) func(directMsg) error {
	if stream != EventsStream {
		return fn
	}
	return func(m directMsg) error {
		s.reads.messages.Add(1)
		s.reads.bytes.Add(uint64(len(m.Data)))
		return fn(m)
	}
}
