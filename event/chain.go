package event

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Hash returns the hex sha256 of a journal message's exact bytes: the prev
// of the message that follows it on the run's subject.
func Hash(body []byte) string {
	sum := sha256.Sum256(body)
	return hex.EncodeToString(sum[:])
}

// ErrJournalCorrupt is matched by every *CorruptError.
var ErrJournalCorrupt = errors.New("journal corrupt")

// CorruptError reports a run's journal that does not verify (Chain): the
// message that should have carried Seq is not a sound continuation of the
// journal. Nothing from that message on is folded.
type CorruptError struct {
	RunID string
	// Seq is the first bad seq: the one after the last sound event.
	Seq    uint64
	Reason string
	// AfterEnd is set when the bad message follows the run's terminal
	// event: the run keeps its end and there is nothing to seal.
	AfterEnd bool
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("run %s: journal corrupt at seq %d: %s", e.RunID, e.Seq, e.Reason)
}

// Is makes errors.Is(err, ErrJournalCorrupt) true.
func (e *CorruptError) Is(target error) bool { return target == ErrJournalCorrupt }

// Seal returns the run_failed event (code journal_corrupt) that ends the
// run: seq e.Seq, right after the last sound event. The writer fills in
// worker_id, ts and prev; Chain accepts it from any writer after the
// corruption, and it is the only message it accepts there.
func (e *CorruptError) Seal() Event {
	ev := MustNew(RunFailed, "", 0, RunFailedData{Code: CodeJournalCorrupt, Seq: e.Seq, Reason: e.Reason,
		Error: fmt.Sprintf("the journal is corrupt at seq %d: %s", e.Seq, e.Reason)})
	ev.RunID, ev.Seq = e.RunID, e.Seq
	return ev
}

// Chain verifies one run's journal message by message, in subject order,
// from the exact bytes of each message. A message is sound when it
// decodes, every event in it is of the run (RunID, the subject's run), its
// seqs continue the journal without a gap, its prev is the Hash of the
// message before it ("" on the first), the run is not over, and each
// event's writer may write it: a Driven kind must carry the worker_id of
// the latest run_resumed (the drive that holds the run). Inputs
// (approval_received, run_cancelled) may come from any writer; who may
// publish at all is NATS's to enforce (roles), not the journal's.
//
// The first message that is not sound sets Corrupt. Nothing from there on
// is returned, except the seal: one run_failed with code journal_corrupt
// at Corrupt.Seq, chained on the message before it, from any writer. It
// ends the journal (Sealed); later messages are ignored.
//
// Chain is pure: the same messages give the same verdict in a worker, the
// projector, runs.Client.Get and pal run verify.
type Chain struct {
	// RunID is the run whose subject the messages come from.
	RunID string
	// Seq is the last sound seq.
	Seq uint64
	// Hash is the Hash of the last message read, sound or not.
	Hash string
	// Driver is the worker_id of the latest run_resumed.
	Driver string
	// Tail means the chain starts mid-journal without knowing its drive
	// (a head read from the last message alone): the writer rule is not
	// applied until the next run_resumed.
	Tail bool
	// Ended is set once a terminal event is read.
	Ended bool
	// Corrupt is the first failure, nil while the journal is sound.
	Corrupt *CorruptError
	// Sealed is set once the seal after the corruption is read.
	Sealed bool
}

// Next verifies the next message and returns its events if they may be
// folded: nil and Corrupt for a message that is not sound (or any after
// it, bar the seal), nil and nil after the seal. It checks the bytes
// only: what an exported journal holds (pal run verify, receipts).
func (c *Chain) Next(body []byte) ([]Event, error) { return c.next(body, nil) }

// Stamp is what the transport says of a journal message besides its
// bytes: the Nats-Msg-Id and Pal-Kind headers PAL's writer sets, and why
// the message is a server's answer that was stored in the journal (a
// Direct Get answer, a republished copy: its own Nats-Stream or
// Nats-Sequence header), "" when it is not.
type Stamp struct {
	MsgID string
	Kinds string
	Echo  string
}

// NextStamped is Next for a message read from the stream, with its
// stamp: a message is sound only when PAL wrote it, its Nats-Msg-Id
// "<run_id>:<first seq>" (the seal's "<run_id>:<seq>:seal-<16 hex of
// its prev>") and its Pal-Kind its events' kinds, and it is no stored
// answer. Everything else Next says holds.
func (c *Chain) NextStamped(body []byte, s Stamp) ([]Event, error) { return c.next(body, &s) }

func (c *Chain) next(body []byte, s *Stamp) ([]Event, error) {
	h := Hash(body)
	defer func() { c.Hash = h }()
	if c.Sealed {
		return nil, nil
	}
	evs, err := Decode(body)
	if c.Corrupt != nil {
		if err == nil && c.isSeal(evs) && (s == nil || s.check(c.RunID, evs, true) == "") {
			c.Sealed, c.Ended, c.Seq = true, true, evs[0].Seq
			return evs, nil
		}
		return nil, c.Corrupt
	}
	if err != nil {
		return nil, c.fail(err.Error())
	}
	if reason := c.check(evs); reason != "" {
		return nil, c.fail(reason)
	}
	if s != nil {
		if reason := s.check(c.RunID, evs, false); reason != "" {
			return nil, c.fail(reason)
		}
	}
	for _, ev := range evs {
		if ev.Kind == RunResumed {
			c.Driver, c.Tail = ev.WorkerID, false
		}
		c.Ended = c.Ended || ev.Kind.Terminal()
	}
	c.Seq = evs[len(evs)-1].Seq
	return evs, nil
}

// check returns why evs, the events of one message with stamp s, were
// not written by PAL, or "". seal allows the seal's Nats-Msg-Id.
func (s *Stamp) check(runID string, evs []Event, seal bool) string {
	if s.Echo != "" {
		return "a stored answer, not a message PAL wrote: " + s.Echo
	}
	id := runID + ":" + strconv.FormatUint(evs[0].Seq, 10)
	if seal && evs[0].Prev != "" {
		id += ":seal-" + evs[0].Prev[:min(16, len(evs[0].Prev))]
	}
	if s.MsgID != id {
		return fmt.Sprintf("Nats-Msg-Id %q, want %q: not a message PAL wrote", clip(s.MsgID), id)
	}
	if kinds := KindsOf(evs); s.Kinds != kinds {
		return fmt.Sprintf("Pal-Kind %q, want %q: not a message PAL wrote", clip(s.Kinds), kinds)
	}
	return ""
}

// KindsOf is a message's Pal-Kind header: its events' kinds, joined by
// commas.
func KindsOf(evs []Event) string {
	if len(evs) == 1 {
		return string(evs[0].Kind)
	}
	ks := make([]string, len(evs))
	for i, ev := range evs {
		ks[i] = string(ev.Kind)
	}
	return strings.Join(ks, ",")
}

func (c *Chain) fail(reason string) error {
	c.Corrupt = &CorruptError{RunID: c.RunID, Seq: c.Seq + 1, Reason: reason, AfterEnd: c.Ended}
	return c.Corrupt
}

// check returns why evs (one message, already decoded) is not a sound
// continuation, or "".
func (c *Chain) check(evs []Event) string {
	driver, tail, ended := c.Driver, c.Tail, c.Ended
	for i, ev := range evs {
		want := c.Seq + uint64(i) + 1
		switch {
		case ended:
			return fmt.Sprintf("%s at seq %d after the run ended", ev.Kind, ev.Seq)
		case ev.RunID != c.RunID:
			return fmt.Sprintf("event of run %q on the subject of run %q", ev.RunID, c.RunID)
		case Link(want, c.Hash, ev.Seq, ev.Prev) != "":
			return Link(want, c.Hash, ev.Seq, ev.Prev)
		case !ev.Kind.Known():
			return fmt.Sprintf("unknown kind %q", ev.Kind)
		case ev.Kind == RunResumed && ev.WorkerID == "":
			return "run_resumed without a worker_id"
		case ev.Kind.Driven() && !tail && driver == "":
			return fmt.Sprintf("%s by %q outside any drive (no run_resumed before it)", ev.Kind, ev.WorkerID)
		case ev.Kind.Driven() && !tail && ev.WorkerID != driver:
			return fmt.Sprintf("%s by %q, but the run is driven by %q (its latest run_resumed)", ev.Kind, ev.WorkerID, driver)
		}
		if ev.Kind == RunResumed {
			driver, tail = ev.WorkerID, false
		}
		ended = ev.Kind.Terminal()
	}
	return ""
}

// Link is the chain's rule for one message after another: it returns
// why a message carrying seq and prev does not follow the message whose
// Hash is hash, when seq want was due, or "". A run's journal (Chain) and
// a thread (ThreadChain) are linked by this one rule.
func Link(want uint64, hash string, seq uint64, prev string) string {
	switch {
	case seq != want:
		return fmt.Sprintf("seq %d where %d was due", seq, want)
	case prev != hash && hash == "":
		return fmt.Sprintf("prev %q on the first message, want none", prev)
	case prev != hash:
		return fmt.Sprintf("prev %q is not the sha256 of the message before it (%s): one of the two was changed or forged", short(prev), short(hash))
	}
	return ""
}

// isSeal reports whether evs is the seal of the corruption c found.
func (c *Chain) isSeal(evs []Event) bool {
	if len(evs) != 1 || c.Ended {
		return false
	}
	ev := evs[0]
	if ev.Kind != RunFailed || ev.RunID != c.RunID || ev.Seq != c.Corrupt.Seq || ev.Prev != c.Hash {
		return false
	}
	var d RunFailedData
	return json.Unmarshal(ev.Data, &d) == nil && d.Code == CodeJournalCorrupt
}

// clip bounds a header's value in a reason: it is whoever wrote it's.
func clip(s string) string {
	if len(s) > 80 {
		return strings.ToValidUTF8(s[:80], "") + "…"
	}
	return s
}

// short abbreviates a hash for a message.
func short(h string) string {
	if len(h) > 12 {
		return h[:12] + "…"
	}
	if h == "" {
		return "none"
	}
	return h
}
