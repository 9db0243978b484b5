package testenv

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/schemas"
)

// Journal is every event of PAL_EVENTS, grouped by run, in order.
type Journal map[string][]event.Event

// ReadJournal reads the whole PAL_EVENTS stream with batched Direct Get and
// checks PAL's journal invariants, failing tb on any breach:
//
//   - every message validates against schemas/event.schema.json;
//   - its Nats-Msg-Id is "<run_id>:<first seq>" and its subject is
//     pal.events.<run_id>;
//   - per run, seq is gapless from 1 and starts with run_created;
//   - a run has at most one terminal event, and nothing follows it;
//   - per run, every message passes event.Chain (prev chain, run id, seq,
//     the drive's writer rule).
func ReadJournal(tb testing.TB, nc *nats.Conn) Journal {
	tb.Helper()
	j, err := readJournal(nc)
	if err != nil {
		tb.Fatalf("journal check: %v", err)
	}
	return j
}

// CheckJournalOnCleanup runs ReadJournal when the test ends (if it has not
// failed already), so every integration test proves the invariants of what
// it wrote.
func CheckJournalOnCleanup(tb testing.TB, nc *nats.Conn) {
	tb.Cleanup(func() {
		if tb.Failed() || nc.IsClosed() {
			return
		}
		if _, err := readJournal(nc); err != nil {
			tb.Errorf("journal check: %v", err)
		}
	})
}

func readJournal(nc *nats.Conn) (Journal, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	j := Journal{}
	terminal := map[string]uint64{}
	chains := map[string]*event.Chain{}
	var next uint64 = 1
	for {
		it, err := jetstreamext.GetBatch(ctx, js, "PAL_EVENTS", 1000, jetstreamext.GetBatchSeq(next))
		if err != nil {
			return nil, err
		}
		pending := uint64(1)
		got := 0
		for m, err := range it {
			if errors.Is(err, jetstreamext.ErrNoMessages) {
				return j, nil
			}
			if err != nil {
				return nil, err
			}
			got++
			next = m.Sequence + 1
			if pending, err = strconv.ParseUint(m.Header.Get("Nats-Num-Pending"), 10, 64); err != nil {
				return nil, fmt.Errorf("stream seq %d: bad Nats-Num-Pending", m.Sequence)
			}
			if err := schemas.ValidateEvent(m.Data); err != nil {
				return nil, fmt.Errorf("stream seq %d does not validate: %v\n%s", m.Sequence, err, m.Data)
			}
			evs, err := event.Decode(m.Data)
			if err != nil {
				return nil, fmt.Errorf("stream seq %d: %v", m.Sequence, err)
			}
			run := evs[0].RunID
			if m.Subject != "pal.events."+run {
				return nil, fmt.Errorf("stream seq %d: run %s on subject %s", m.Sequence, run, m.Subject)
			}
			if id, want := m.Header.Get(jetstream.MsgIDHeader), fmt.Sprintf("%s:%d", run, evs[0].Seq); id != want {
				return nil, fmt.Errorf("stream seq %d: Nats-Msg-Id %q, want %q", m.Sequence, id, want)
			}
			c := chains[run]
			if c == nil {
				c = &event.Chain{RunID: run}
				chains[run] = c
			}
			if _, err := c.Next(m.Data); err != nil {
				return nil, fmt.Errorf("stream seq %d: %v", m.Sequence, err)
			}
			for _, ev := range evs {
				prev := j[run]
				if want := uint64(len(prev)) + 1; ev.Seq != want {
					return nil, fmt.Errorf("run %s: seq %d where %d was due (gap or duplicate)", run, ev.Seq, want)
				}
				if ev.Seq == 1 && ev.Kind != event.RunCreated {
					return nil, fmt.Errorf("run %s: first event is %s", run, ev.Kind)
				}
				if t, ok := terminal[run]; ok {
					return nil, fmt.Errorf("run %s: %s at seq %d after the terminal event at seq %d", run, ev.Kind, ev.Seq, t)
				}
				if ev.Kind.Terminal() {
					terminal[run] = ev.Seq
				}
				j[run] = append(prev, ev)
			}
		}
		if got == 0 {
			return nil, fmt.Errorf("reading PAL_EVENTS from seq %d: no reply", next)
		}
		if pending == 0 {
			return j, nil
		}
	}
}

// Kinds lists the kinds of a run's events, in order.
func (j Journal) Kinds(runID string) []event.Kind {
	var out []event.Kind
	for _, ev := range j[runID] {
		out = append(out, ev.Kind)
	}
	return out
}

// Count counts a run's events of kind k (and step, when not empty).
func (j Journal) Count(runID string, k event.Kind, step string) int {
	n := 0
	for _, ev := range j[runID] {
		if ev.Kind == k && (step == "" || ev.StepID == step) {
			n++
		}
	}
	return n
}
