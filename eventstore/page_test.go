package eventstore_test

import (
	"encoding/json"
	"fmt"
	"math/bits"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
)

// readPages reads p until it is caught up and returns the events and the
// pages' sizes.
func readPages(t *testing.T, p *eventstore.Pages) (evs []event.Event, pages []int) {
	t.Helper()
	for {
		page, err := p.Next(t.Context())
		require.NoError(t, err)
		evs = append(evs, page...)
		pages = append(pages, len(page))
		if p.CaughtUp() {
			return evs, pages
		}
		require.NotEmpty(t, page, "a page short of the end holds events")
	}
}

// TestPages reads a run scattered over the stream (other runs' messages
// between each of its own), one event per message and packed, from every
// kind of start: the first event, the middle of a packed message, the
// last event, past it. Every event after the start arrives once, in
// order; a reader at the head reads one message; a reader in the middle
// reads what it returns plus a bisection of the stream, not what comes
// before its start.
func TestPages(t *testing.T) {
	t.Parallel()
	for _, packed := range []bool{false, true} {
		t.Run(packName(packed), func(t *testing.T) {
			t.Parallel()
			b := setup(t, eventstore.Config{}, eventstore.WithPacking(packed))
			ctx := t.Context()
			const run = "run_pages"
			h := eventstore.Head{}
			for n := 1; n <= 600; n += 3 {
				var err error
				h, err = b.store.Append(ctx, run, h, ev(event.ApprovalReceived, n), ev(event.ApprovalReceived, n+1), ev(event.ApprovalReceived, n+2))
				require.NoError(t, err)
				_, err = b.store.Append(ctx, fmt.Sprintf("run_other%d", n), eventstore.Head{}, ev(event.RunCreated, 1))
				require.NoError(t, err)
			}
			msgs := uint64(600)
			if packed {
				msgs = 200
			}
			streamLen := b.lastMsg(t, run).Sequence
			for _, after := range []uint64{0, 1, 2, 3, 100, 298, 299, 300, 301, 599, 600, 700} {
				s := b.openStore(t) // its own ReadStats
				p, err := s.Pages(run, after)
				require.NoError(t, err)
				evs, pages := readPages(t, p)
				want := max(0, 600-int(after))
				require.Len(t, evs, want, "after %d", after)
				for i, e := range evs {
					require.Equal(t, after+uint64(i)+1, e.Seq, "after %d: in order, each once", after)
					require.Equal(t, int(e.Seq), dataN(t, e))
				}
				for _, n := range pages {
					per := 1
					if packed {
						per = 3
					}
					require.LessOrEqual(t, n, eventstore.PageMessages*per, "after %d: a page is bounded", after)
				}
				require.Equal(t, h, p.Head(), "after %d: the reader stands at the head", after)
				require.False(t, p.Ended())

				read := s.ReadStats().Messages
				switch {
				case after >= 600:
					require.Equal(t, uint64(1), read, "after %d: at the head, one message read", after)
				case after == 0:
					require.Equal(t, msgs+1, read, "from the start: the last message, then each once")
				default:
					per := 600 / msgs
					sent := msgs - after/per                    // the messages holding the events returned
					probes := uint64(bits.Len64(streamLen)) + 2 // the bisection, the last and the one before
					require.LessOrEqual(t, read, sent+probes, "after %d: not the journal before the start", after)
				}
			}

			// A reader at the head gets what is appended later.
			p, err := b.store.Pages(run, 600)
			require.NoError(t, err)
			page, err := p.Next(ctx)
			require.NoError(t, err)
			require.Empty(t, page)
			require.True(t, p.CaughtUp())
			_, err = b.store.Append(ctx, run, h, ev(event.RunSucceeded, 601))
			require.NoError(t, err)
			page, err = p.Next(ctx)
			require.NoError(t, err)
			require.Len(t, page, 1)
			require.Equal(t, uint64(601), page[0].Seq)
			require.True(t, p.Ended())

			// After the end: nothing to read, and the reader says the run
			// has ended, from the last message alone.
			s := b.openStore(t)
			p, err = s.Pages(run, 601)
			require.NoError(t, err)
			page, err = p.Next(ctx)
			require.NoError(t, err)
			require.Empty(t, page)
			require.True(t, p.Ended())
			require.Equal(t, uint64(1), s.ReadStats().Messages)
		})
	}
}

// TestPagesBounded: a page of big messages stops at PageBytes, plus the
// message that crossed it.
func TestPagesBounded(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{})
	ctx := t.Context()
	const run = "run_big"
	big := strings.Repeat("x", 6<<10)
	h := eventstore.Head{}
	for n := 1; n <= 40; n++ {
		e := ev(event.ApprovalReceived, n)
		e.Data = json.RawMessage(fmt.Sprintf(`{"n":%d,"pad":%q}`, n, big))
		var err error
		h, err = b.store.Append(ctx, run, h, e)
		require.NoError(t, err)
	}
	s := b.openStore(t)
	p, err := s.Pages(run, 0)
	require.NoError(t, err)
	total := 0
	for !p.CaughtUp() {
		before := s.ReadStats()
		page, err := p.Next(ctx)
		require.NoError(t, err)
		total += len(page)
		got := s.ReadStats()
		msgBytes := got.Bytes - before.Bytes
		if before.Messages == 0 {
			msgBytes -= uint64(len(b.lastMsg(t, run).Data)) // the placing read
		}
		require.LessOrEqual(t, msgBytes, uint64(eventstore.PageBytes+7<<10), "a page is PageBytes and one message")
		require.LessOrEqual(t, len(page), eventstore.PageBytes/(6<<10)+1)
	}
	require.Equal(t, 40, total)
	require.Equal(t, h, p.Head())
}

// TestPagesCorrupt: a message that is not a sound continuation ends the
// read after the sound events with *event.CorruptError, from any start
// (a reader in the middle, or at what looks like the head, reads from the
// start when the message on its way is not one of the run's); once the
// journal is sealed, the seal is the last event and ends the run.
func TestPagesCorrupt(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{})
	ctx := t.Context()
	const run = "run_bad"
	h := eventstore.Head{}
	for n := 1; n <= 10; n++ {
		var err error
		h, err = b.store.Append(ctx, run, h, ev(event.ApprovalReceived, n))
		require.NoError(t, err)
	}
	_, err := b.js.Publish(ctx, eventstore.EventsSubject(run), []byte(`{"v":1,"oops"`))
	require.NoError(t, err)
	for _, after := range []uint64{0, 4, 10} {
		p, err := b.store.Pages(run, after)
		require.NoError(t, err)
		var got []event.Event
		for {
			page, err := p.Next(ctx)
			got = append(got, page...)
			if err != nil {
				require.ErrorIs(t, err, event.ErrJournalCorrupt, "after %d", after)
				var ce *event.CorruptError
				require.ErrorAs(t, err, &ce)
				require.Equal(t, uint64(11), ce.Seq)
				break
			}
			require.False(t, p.CaughtUp(), "after %d: caught up without the corruption", after)
		}
		require.Len(t, got, 10-int(after), "after %d: the sound events after it", after)
	}

	_, head, err := b.store.Read(ctx, run)
	var ce *event.CorruptError
	require.ErrorAs(t, err, &ce)
	_, _, err = b.store.Seal(ctx, run, head, ce, "w1")
	require.NoError(t, err)
	for _, after := range []uint64{4, 10} {
		p, err := b.store.Pages(run, after)
		require.NoError(t, err)
		evs, _ := readPages(t, p)
		require.Len(t, evs, 11-int(after), "after %d", after)
		seal := evs[len(evs)-1]
		require.Equal(t, event.RunFailed, seal.Kind)
		require.Equal(t, uint64(11), seal.Seq)
		require.True(t, p.Ended())
	}
	p, err := b.store.Pages(run, 11)
	require.NoError(t, err)
	page, err := p.Next(ctx)
	require.NoError(t, err)
	require.Empty(t, page)
	require.True(t, p.Ended(), "the seal ends the run")

	p, err = b.store.Pages("run_nobody", 0)
	require.NoError(t, err)
	_, err = p.Next(ctx)
	require.ErrorIs(t, err, eventstore.ErrRunNotFound)
	_, err = b.store.Pages("run.x", 0)
	require.ErrorIs(t, err, event.ErrInvalidRunID)
}
