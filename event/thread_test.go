package event_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
)

func TestValidateThreadID(t *testing.T) {
	t.Parallel()
	for id, want := range map[string]string{
		"support-42":             "",
		"A_b-9":                  "",
		strings.Repeat("t", 128): "",
		"":                       "empty",
		strings.Repeat("t", 129): "longer than 128 characters",
		"a.b":                    `character '.' not allowed`,
		"a*":                     `character '*' not allowed`,
		"a>":                     `character '>' not allowed`,
		"a b":                    `character ' ' not allowed`,
		"caf\u00e9":              `character 'é' not allowed`,
	} {
		err := event.ValidateThreadID(id)
		if want == "" {
			require.NoError(t, err, id)
			continue
		}
		require.ErrorIs(t, err, event.ErrInvalidThreadID, id)
		require.ErrorContains(t, err, "invalid thread id", id)
		require.ErrorContains(t, err, want, id)
	}
}

// record is a thread record as AppendThread writes it after th.
func record(th event.Thread, r event.ThreadRecord) ([]byte, event.Stamp) {
	r.V, r.Thread, r.Seq, r.Prev = 1, th.ID, th.Seq+1, th.Hash
	body, _ := json.Marshal(r)
	return body, event.Stamp{MsgID: event.ThreadMsgID(r)}
}

// ThreadChain folds holds and turns, and refuses a record that does not
// follow the one before (event.Link), names another thread, carries
// another Nats-Msg-Id, is a stored answer or of an unknown kind.
func TestThreadChain(t *testing.T) {
	t.Parallel()
	c := event.NewThreadChain("t")
	body, st := record(c.Thread, event.ThreadRecord{Kind: event.ThreadOpen, RunID: "run_a", StepID: "s"})
	require.NoError(t, c.Next(body, 10, st))
	body, st = record(c.Thread, event.ThreadRecord{Kind: event.ThreadOpen, RunID: "run_b", StepID: "s"})
	require.NoError(t, c.Next(body, 11, st))
	require.Equal(t, []event.Hold{{RunID: "run_a", StepID: "s", Seq: 1}, {RunID: "run_b", StepID: "s", Seq: 2}}, c.Thread.Holds)
	body, st = record(c.Thread, event.ThreadRecord{Kind: event.ThreadClose, RunID: "run_a", StepID: "s", Reason: "its run ended"})
	require.NoError(t, c.Next(body, 12, st))
	h, busy := c.Thread.HeldBy("run_a")
	require.True(t, busy)
	require.Equal(t, "run_b", h.RunID)
	body, st = record(c.Thread, event.ThreadRecord{Kind: event.ThreadTurns, RunID: "run_b", StepID: "s",
		Turns: []event.ThreadTurn{{Role: "user", Content: "q"}, {Role: "assistant", Content: "a"}}})
	require.NoError(t, c.Next(body, 13, st))
	require.Empty(t, c.Thread.Holds)
	require.Equal(t, []event.Turn{{Seq: 4, RunID: "run_b", StepID: "s", Role: "user", Content: "q"},
		{Seq: 4, RunID: "run_b", StepID: "s", Role: "assistant", Content: "a"}}, c.Thread.Turns)
	require.Equal(t, uint64(13), c.Thread.StreamSeq)
	require.Equal(t, event.Hash(body), c.Thread.Hash)
	good := c.Thread

	next := event.ThreadRecord{Kind: event.ThreadOpen, RunID: "run_c", StepID: "s"}
	for name, tc := range map[string]struct {
		mutate func(r *event.ThreadRecord)
		stamp  func(s *event.Stamp)
		want   string
	}{
		"seq skipped":   {mutate: func(r *event.ThreadRecord) { r.Seq++ }, want: "seq 6 where 5 was due"},
		"prev changed":  {mutate: func(r *event.ThreadRecord) { r.Prev = strings.Repeat("0", 64) }, want: "is not the sha256 of the message before it"},
		"other thread":  {mutate: func(r *event.ThreadRecord) { r.Thread = "u" }, want: `a record of thread "u"`},
		"unknown kind":  {mutate: func(r *event.ThreadRecord) { r.Kind = "trim" }, want: `unknown kind "trim"`},
		"other msg id":  {stamp: func(s *event.Stamp) { s.MsgID = "t:5" }, want: "not a record PAL wrote"},
		"stored answer": {stamp: func(s *event.Stamp) { s.Echo = "it carries its own Nats-Sequence header" }, want: "a stored answer"},
	} {
		c := event.ThreadChain{Thread: good}
		r := next
		r.V, r.Thread, r.Seq, r.Prev = 1, good.ID, good.Seq+1, good.Hash
		if tc.mutate != nil {
			tc.mutate(&r)
		}
		body, _ := json.Marshal(r)
		st := event.Stamp{MsgID: event.ThreadMsgID(r)}
		if tc.stamp != nil {
			tc.stamp(&st)
		}
		err := c.Next(body, 14, st)
		require.ErrorIs(t, err, event.ErrThreadCorrupt, name)
		require.ErrorContains(t, err, tc.want, name)
		require.ErrorContains(t, err, "thread t at seq 5", name)
	}
}
