package event_test

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
)

// chained encodes groups of events as consecutive messages of run "run_a",
// numbering seqs and chaining prev as the event store does.
func chained(t *testing.T, groups ...[]event.Event) [][]byte {
	t.Helper()
	var out [][]byte
	prev, seq := "", uint64(0)
	for _, g := range groups {
		for i := range g {
			seq++
			g[i].V, g[i].Seq, g[i].Prev, g[i].TS = event.Version, seq, prev, time.Unix(int64(seq), 0).UTC()
			if g[i].RunID == "" {
				g[i].RunID = "run_a"
			}
			if g[i].Data == nil {
				g[i].Data = json.RawMessage(`{}`)
			}
		}
		body, err := event.Encode(g...)
		require.NoError(t, err)
		out = append(out, body)
		prev = event.Hash(body)
	}
	return out
}

func by(k event.Kind, worker string) event.Event {
	return event.Event{Kind: k, WorkerID: worker, StepID: "s1", Attempt: 1}
}

func one(k event.Kind, worker string) []event.Event { return []event.Event{by(k, worker)} }

// sound is a journal: created, a drive by w1 (one packed message), a
// decision by an approver, a step.
func sound(t *testing.T) [][]byte {
	return chained(t, one(event.RunCreated, "pal"),
		[]event.Event{by(event.RunResumed, "w1"), by(event.StepStarted, "w1")},
		one(event.ApprovalReceived, "ana"),
		one(event.StepCompleted, "w1"))
}

// verify runs a chain over msgs and returns it, with how many events it
// accepted.
func verify(msgs [][]byte) (*event.Chain, int) {
	c := &event.Chain{RunID: "run_a"}
	n := 0
	for _, m := range msgs {
		evs, _ := c.Next(m)
		n += len(evs)
	}
	return c, n
}

func TestChainAcceptsASoundJournal(t *testing.T) {
	t.Parallel()
	msgs := sound(t)
	c, n := verify(msgs)
	require.Nil(t, c.Corrupt)
	require.Equal(t, 5, n)
	require.Equal(t, uint64(5), c.Seq)
	require.Equal(t, "w1", c.Driver)
	require.Equal(t, event.Hash(msgs[3]), c.Hash)

	// Every event of a packed message carries the prev of the message.
	evs, err := event.Decode(msgs[1])
	require.NoError(t, err)
	require.Equal(t, event.Hash(msgs[0]), evs[0].Prev)
	require.Equal(t, evs[0].Prev, evs[1].Prev)
}

func TestChainFindsTheFirstBadMessage(t *testing.T) {
	t.Parallel()
	replace := func(i int, body []byte) func([][]byte) [][]byte {
		return func(m [][]byte) [][]byte { m[i] = body; return m }
	}
	tests := []struct {
		name   string
		edit   func([][]byte) [][]byte
		seq    uint64
		reason string
	}{
		{"not JSON", replace(2, []byte("hello")), 4, "malformed"},
		{"seq gap", func(m [][]byte) [][]byte {
			return append(m[:3:3], chained(t, one(event.RunCreated, "pal"), one(event.RunResumed, "w1"),
				one(event.StepStarted, "w1"), one(event.StepStarted, "w1"), one(event.StepStarted, "w1"), one(event.StepCompleted, "w1"))[5])
		}, 5, "seq 6 where 5 was due"},
		{"another run's event", func(m [][]byte) [][]byte {
			ev := by(event.StepCompleted, "w1")
			ev.RunID = "run_b"
			ev.V, ev.Seq, ev.Prev, ev.Data = 1, 5, event.Hash(m[2]), json.RawMessage(`{}`)
			body, _ := event.Encode(ev)
			m[3] = body
			return m
		}, 5, `event of run "run_b" on the subject of run "run_a"`},
		{"forged writer", func(m [][]byte) [][]byte {
			ev := by(event.StepCompleted, "mallory")
			ev.RunID, ev.V, ev.Seq, ev.Prev, ev.Data = "run_a", 1, 5, event.Hash(m[2]), json.RawMessage(`{}`)
			body, _ := event.Encode(ev)
			m[3] = body
			return m
		}, 5, `step_completed by "mallory", but the run is driven by "w1"`},
		{"one byte changed", func(m [][]byte) [][]byte {
			m[2] = bytes.Replace(m[2], []byte(`"ana"`), []byte(`"anb"`), 1)
			return m
		}, 5, "is not the sha256 of the message before it"},
		{"a copy again", func(m [][]byte) [][]byte { return append(m, m[3]) }, 6, "seq 5 where 6 was due"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, _ := verify(tt.edit(sound(t)))
			require.NotNil(t, c.Corrupt)
			require.ErrorIs(t, c.Corrupt, event.ErrJournalCorrupt)
			require.Equal(t, tt.seq, c.Corrupt.Seq, c.Corrupt.Error())
			require.Contains(t, c.Corrupt.Reason, tt.reason)
			require.Equal(t, tt.seq-1, c.Seq, "nothing from the bad message on is taken")
		})
	}
}

func TestChainDriveRule(t *testing.T) {
	t.Parallel()
	// A step before any drive.
	c, _ := verify(chained(t, one(event.RunCreated, "pal"), one(event.StepStarted, "w1")))
	require.NotNil(t, c.Corrupt)
	require.Contains(t, c.Corrupt.Reason, "outside any drive")

	// A new drive hands the run to w2; w1's late event is refused, an
	// input from anyone is not.
	c, _ = verify(chained(t, one(event.RunCreated, "pal"), one(event.RunResumed, "w1"), one(event.RunResumed, "w2"),
		one(event.RunCancelled, "anyone"), one(event.StepStarted, "w1")))
	require.NotNil(t, c.Corrupt)
	require.Equal(t, uint64(5), c.Corrupt.Seq)
	require.True(t, c.Corrupt.AfterEnd, "the cancel ended the run first")

	// A chain from the middle (a head) applies the rule from the next
	// run_resumed on.
	msgs := chained(t, one(event.RunCreated, "pal"), one(event.RunResumed, "w1"), one(event.StepStarted, "w1"),
		one(event.RunResumed, "w2"), one(event.StepStarted, "w1"))
	tail := &event.Chain{RunID: "run_a", Seq: 2, Hash: event.Hash(msgs[1]), Tail: true}
	evs, err := tail.Next(msgs[2])
	require.NoError(t, err)
	require.Len(t, evs, 1)
	_, err = tail.Next(msgs[3])
	require.NoError(t, err)
	_, err = tail.Next(msgs[4])
	require.ErrorIs(t, err, event.ErrJournalCorrupt)
}

func TestChainSeal(t *testing.T) {
	t.Parallel()
	msgs := sound(t)
	msgs = append(msgs[:4:4], []byte("garbage"), []byte("more garbage"))
	c, _ := verify(msgs)
	require.NotNil(t, c.Corrupt)
	require.Equal(t, uint64(6), c.Corrupt.Seq)

	seal := c.Corrupt.Seal()
	seal.WorkerID, seal.TS = "w9", time.Unix(99, 0).UTC()
	wrong := seal
	wrong.Prev = event.Hash(msgs[4]) // not the last message
	body, err := event.Encode(wrong)
	require.NoError(t, err)
	got, err := c.Next(body)
	require.ErrorIs(t, err, event.ErrJournalCorrupt)
	require.Empty(t, got)

	seal.Prev = c.Hash // chained on what came before it: the rejected try
	body, err = event.Encode(seal)
	require.NoError(t, err)
	got, err = c.Next(body)
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.True(t, c.Sealed)
	var d event.RunFailedData
	require.NoError(t, got[0].DecodeData(&d))
	require.Equal(t, event.CodeJournalCorrupt, d.Code)
	require.Equal(t, uint64(6), d.Seq)
	require.Contains(t, d.Error, "malformed")

	got, err = c.Next([]byte("after the seal"))
	require.NoError(t, err)
	require.Empty(t, got, "nothing after the seal is read")
}
