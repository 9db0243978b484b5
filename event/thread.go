package event

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// A thread is a conversation that outlives a run (docs/architecture.md
// §5.1, §7.3): a start names it (run_created.thread) and each ai-step or
// agent with thread: true starts from its turns and appends its own. It
// is journaled on its own subject, pal.threads.<thread_id>, one
// ThreadRecord per message, linked like a run's journal (Link: seq after
// seq, prev the Hash of the message before), so a thread read back is the
// thread written, or it is refused as corrupt.
//
// A thread step's records, in order:
//
//   - open: the run's step holds the thread (written before its first
//     model call). While another run holds it, a thread step waits: two
//     runs never interleave their turns.
//   - turns: the step's turns (the user prompt and the assistant's
//     answer), written once its step_completed is journaled; it releases
//     the hold.
//   - close: the hold released without turns (the run ended before its
//     step completed, or a waiter found the holder's run ended).
//
// Each (kind, run, step) is written at most once: a writer reads the
// thread first and appends fenced on its last subject sequence.

// MaxThreadIDLen bounds thread ids, as run ids are bounded.
const MaxThreadIDLen = 128

// The default bounds of one thread (eventstore.ThreadLimits): a step
// that would take the thread past either fails (class validation), and
// the thread keeps what it has.
const (
	DefaultThreadMaxTurns = 1000
	DefaultThreadMaxBytes = 8 << 20
)

// ErrInvalidThreadID is wrapped by every error of ValidateThreadID.
var ErrInvalidThreadID = errors.New("invalid thread id")

// ValidateThreadID checks that id can be one NATS subject token: 1 to
// MaxThreadIDLen characters of A–Z, a–z, 0–9, '_' and '-' (the run-id
// alphabet, §5.5).
func ValidateThreadID(id string) error {
	if reason := tokenProblem(id, MaxThreadIDLen); reason != "" {
		return fmt.Errorf("%w%s", ErrInvalidThreadID, reason)
	}
	return nil
}

// The kinds of thread records.
const (
	ThreadOpen  = "open"
	ThreadTurns = "turns"
	ThreadClose = "close"
)

// ThreadRecord is one message of a thread's subject.
type ThreadRecord struct {
	V      int       `json:"v"`
	Thread string    `json:"thread"`
	Seq    uint64    `json:"seq"`
	Prev   string    `json:"prev,omitempty"`
	TS     time.Time `json:"ts"`
	Kind   string    `json:"kind"`
	RunID  string    `json:"run_id"`
	StepID string    `json:"step_id"`
	// Turns are a turns record's, in order.
	Turns []ThreadTurn `json:"turns,omitempty"`
	// Reason says why a close released the hold.
	Reason string `json:"reason,omitempty"`
}

// ThreadTurn is one message of the conversation.
type ThreadTurn struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// ThreadMsgID is the Nats-Msg-Id of a thread record: a re-sent record is
// stored once (the stream's dedup window), and the writer's read of the
// thread keeps it once beyond it.
func ThreadMsgID(r ThreadRecord) string {
	return r.Thread + ":" + r.Kind + ":" + r.RunID + ":" + r.StepID
}

// Turn is one turn of a thread as read: the record's seq, the run and
// step that wrote it.
type Turn struct {
	Seq     uint64 `json:"seq"`
	RunID   string `json:"run_id"`
	StepID  string `json:"step_id"`
	Role    string `json:"role"`
	Content string `json:"content"`
}

// Hold is a thread step holding its thread (an open without its turns
// or close).
type Hold struct {
	RunID  string `json:"run_id"`
	StepID string `json:"step_id"`
	Seq    uint64 `json:"seq"`
}

// Thread is a thread folded from its records (ThreadChain).
type Thread struct {
	ID string `json:"thread"`
	// Seq is the last record's seq, Hash its message's Hash (the next
	// record's prev); StreamSeq its stream sequence (what an append is
	// fenced on).
	Seq       uint64 `json:"seq"`
	Hash      string `json:"-"`
	StreamSeq uint64 `json:"-"`
	// Bytes is the size of every record's message together.
	Bytes int    `json:"bytes"`
	Turns []Turn `json:"turns"`
	// Holds are the steps holding the thread, oldest first.
	Holds []Hold `json:"holds,omitempty"`
	done  map[string]bool
}

// Has reports whether a record of kind for run's step is in the thread.
func (t *Thread) Has(kind, runID, stepID string) bool {
	return t.done[kind+"|"+runID+"|"+stepID]
}

// HeldBy returns the oldest hold of a run other than runID, if any: a
// step of runID waits while there is one.
func (t *Thread) HeldBy(runID string) (Hold, bool) {
	for _, h := range t.Holds {
		if h.RunID != runID {
			return h, true
		}
	}
	return Hold{}, false
}

// ThreadChain verifies a thread's messages in subject order and folds
// them into Thread.
type ThreadChain struct {
	Thread Thread
}

// NewThreadChain starts the chain of thread id, empty.
func NewThreadChain(id string) *ThreadChain {
	return &ThreadChain{Thread: Thread{ID: id, Turns: []Turn{}, done: map[string]bool{}}}
}

// ErrThreadCorrupt is wrapped by every refusal of ThreadChain.Next.
var ErrThreadCorrupt = errors.New("thread corrupt")

// Next verifies the next message, stored at streamSeq with stamp s (the
// transport's Nats-Msg-Id, which must be ThreadMsgID of the record, and
// no stored answer), and folds it. An error wrapping ErrThreadCorrupt
// means the thread is corrupt from this message on.
func (c *ThreadChain) Next(body []byte, streamSeq uint64, s Stamp) error {
	t := &c.Thread
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: thread %s at seq %d: %s", ErrThreadCorrupt, t.ID, t.Seq+1, fmt.Sprintf(format, args...))
	}
	var r ThreadRecord
	if err := json.Unmarshal(body, &r); err != nil {
		return bad("the record does not decode: %v", err)
	}
	switch {
	case r.Thread != t.ID:
		return bad("a record of thread %q on its subject", clip(r.Thread))
	case s.Echo != "":
		return bad("a stored answer, not a record PAL wrote: %s", s.Echo)
	case s.MsgID != ThreadMsgID(r):
		return bad("Nats-Msg-Id %q, want %q: not a record PAL wrote", clip(s.MsgID), ThreadMsgID(r))
	}
	if reason := Link(t.Seq+1, t.Hash, r.Seq, r.Prev); reason != "" {
		return bad("%s", reason)
	}
	switch r.Kind {
	case ThreadOpen:
		t.Holds = append(t.Holds, Hold{RunID: r.RunID, StepID: r.StepID, Seq: r.Seq})
	case ThreadTurns, ThreadClose:
		for i, h := range t.Holds {
			if h.RunID == r.RunID && h.StepID == r.StepID {
				t.Holds = append(t.Holds[:i:i], t.Holds[i+1:]...)
				break
			}
		}
		for _, m := range r.Turns {
			t.Turns = append(t.Turns, Turn{Seq: r.Seq, RunID: r.RunID, StepID: r.StepID, Role: m.Role, Content: m.Content})
		}
	default:
		return bad("unknown kind %q", clip(r.Kind))
	}
	t.done[r.Kind+"|"+r.RunID+"|"+r.StepID] = true
	t.Seq, t.Hash, t.StreamSeq = r.Seq, Hash(body), streamSeq
	t.Bytes += len(body)
	return nil
}
