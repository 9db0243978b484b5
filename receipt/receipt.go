// Package receipt signs a finished run's journal: the run receipt. "The
// completed run's journal is what the receipt is signed over"
// (docs/architecture.md §10.9).
//
// A receipt names the run, its workflow, how it ended, the seq range and
// event count of its journal, the journal digest (the hash-chain head: the
// sha256 of the last message's exact bytes, which through every message's
// prev commits to the whole journal) and the hash of the message holding
// the terminal event, the run's token and cost totals, the signing key's id
// and the time of signing. The signature is Ed25519 over Canonical: the
// receipt's JSON without its signature, keys sorted, no spaces.
//
// Anyone with the journal (pal run export) and the public key can check a
// receipt offline (Verify): the chain is recomputed message by message, so
// a changed byte in any event names the first seq that no longer verifies.
//
// Exactly once: the receipt is stored with a KV create keyed by run id
// (Store.Sign, Store.Ensure), so the first signer wins and every later
// call returns the stored receipt. The worker that ends a run signs at
// once, from the tally of the journal it read and appended as it drove
// the run and the chain head it holds (Tally), without reading the
// journal again; the recovery sweep signs runs whose worker died between
// the terminal event and the put, or held no whole tally, reading the
// journal (Store.Ensure, Build). Build tallies as a worker does, so both
// build the same receipt of the same journal; only signed_at and, after a
// key rotation, key_id can differ, and the create keeps the first.
package receipt

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/palrun/pal/event"
)

// Version is the receipt format version ("v").
const Version = 1

// Alg is the signature algorithm.
const Alg = "Ed25519"

// Receipt is a signed statement over one finished run's journal.
type Receipt struct {
	V        int    `json:"v"`
	RunID    string `json:"run_id"`
	Workflow string `json:"workflow,omitempty"`
	// Status is succeeded, failed or cancelled; TerminalKind the event.
	Status       string     `json:"status"`
	TerminalKind event.Kind `json:"terminal_kind"`
	FirstSeq     uint64     `json:"first_seq"`
	LastSeq      uint64     `json:"last_seq"`
	Events       int        `json:"events"`
	Messages     int        `json:"messages"`
	// JournalDigest is the chain head: event.Hash of the last message.
	JournalDigest string `json:"journal_digest"`
	// TerminalEventHash is event.Hash of the message that holds the
	// terminal event.
	TerminalEventHash string `json:"terminal_event_hash"`
	TerminalSeq       uint64 `json:"terminal_seq"`
	InputTokens       int64  `json:"input_tokens"`
	OutputTokens      int64  `json:"output_tokens"`
	// CostUSD is written as a decimal string so that every JSON library
	// reproduces the signed bytes.
	CostUSD  string    `json:"cost_usd"`
	KeyID    string    `json:"key_id"`
	Alg      string    `json:"alg"`
	SignedAt time.Time `json:"signed_at"`
	// Signature is base64 (standard, padded) of the Ed25519 signature over
	// Canonical.
	Signature string `json:"signature,omitempty"`
}

// MaxMessages bounds the journal Build reads (a journal longer than this is
// refused rather than held in memory without end).
const MaxMessages = 1 << 20

// ErrNotEnded is returned by Build for a journal without a terminal event.
var ErrNotEnded = errors.New("the run has not ended")

// Build computes the unsigned receipt of runID from its journal messages,
// in subject order, checking the chain as it goes. A journal that does not
// verify returns the *event.CorruptError; one that did not end returns
// ErrNotEnded. A sealed corrupt journal (ended by run_failed with code
// journal_corrupt) still gets a receipt: it covers the sound prefix and the
// seal, and the unsound messages are counted but not folded.
func Build(runID string, msgs [][]byte) (*Receipt, error) { return BuildStamped(runID, msgs, nil) }

// BuildStamped is Build for messages read from the stream with their
// stamps (event.Chain.NextStamped): a message PAL did not write is
// unsound however sound its bytes.
func BuildStamped(runID string, msgs [][]byte, stamps []event.Stamp) (*Receipt, error) {
	if len(msgs) > MaxMessages {
		return nil, fmt.Errorf("the journal has %d messages; a receipt covers at most %d", len(msgs), MaxMessages)
	}
	c := &event.Chain{RunID: runID}
	t := NewTally(runID)
	var terminalHash string
	for i, body := range msgs {
		var evs []event.Event
		var err error
		if stamps != nil {
			evs, err = c.NextStamped(body, stamps[i])
		} else {
			evs, err = c.Next(body)
		}
		if err != nil && !c.Ended {
			var ce *event.CorruptError
			if errors.As(err, &ce) && i+1 < len(msgs) {
				continue // a seal may follow
			}
			return nil, err
		}
		t.Add(evs...)
		for _, ev := range evs {
			if ev.Kind.Terminal() {
				terminalHash = event.Hash(body)
			}
		}
	}
	r, err := t.receipt()
	if err != nil {
		return nil, err
	}
	// Counted from the bytes, which a tally of events cannot see: the
	// unsound messages before a seal, and any after the end.
	r.Messages, r.JournalDigest, r.TerminalEventHash = len(msgs), c.Hash, terminalHash
	return r, nil
}

// Tally is a receipt taken event by event, in journal order, from events
// a read verified (event.Chain) or an append stored: their seq range and
// count, the workflow's name, how the run ended and the step_completed
// usages, and, from each event's prev, where a message begins. A worker
// tallies the journal it reads and appends as it drives a run and builds
// the run's receipt from the tally and the chain head it holds
// (Tally.Receipt), with no read of the journal; Build tallies the same
// way, so that the two agree. The zero Tally is not ready: use NewTally.
type Tally struct {
	r     Receipt
	usage event.Usage
	// messages counts the messages taken; prev is the prev of the last
	// event, which names the message before it.
	messages int
	prev     string
	// broken says why the events taken are not a journal's; "" while
	// they are.
	broken string
	// sealed: the events end with the seal of a corrupt journal, whose
	// unsound messages no event shows; only Build, which has the
	// messages, can count them.
	sealed bool
}

// NewTally returns an empty tally of run runID's journal.
func NewTally(runID string) *Tally { return &Tally{r: Receipt{V: Version, RunID: runID}} }

// Add takes the next events of the journal. An event that does not
// follow the last one taken (the next seq of the same run, nothing after
// the terminal event) breaks the tally: Receipt then refuses, and the
// caller reads the journal instead.
func (t *Tally) Add(evs ...event.Event) {
	for _, ev := range evs {
		switch {
		case t.broken != "":
			return
		case ev.RunID != t.r.RunID:
			t.broken = fmt.Sprintf("an event of run %q", ev.RunID)
		case ev.Seq != t.r.LastSeq+1:
			t.broken = fmt.Sprintf("seq %d after seq %d", ev.Seq, t.r.LastSeq)
		case t.r.TerminalKind != "":
			t.broken = fmt.Sprintf("seq %d after the run ended", ev.Seq)
		}
		if t.broken != "" {
			return
		}
		if t.messages == 0 || ev.Prev != t.prev {
			t.messages++
		}
		t.prev = ev.Prev
		if t.r.FirstSeq == 0 {
			t.r.FirstSeq = ev.Seq
		}
		t.r.LastSeq = ev.Seq
		t.r.Events++
		switch {
		case ev.Kind == event.RunCreated:
			var d event.RunCreatedData
			if ev.DecodeData(&d) == nil {
				t.r.Workflow = d.WorkflowName
			}
		case ev.Kind == event.StepCompleted:
			var d event.StepCompletedData
			if ev.DecodeData(&d) == nil && d.Usage != nil {
				t.usage.Add(*d.Usage)
			}
		case ev.Kind.Terminal():
			t.r.TerminalKind, t.r.TerminalSeq = ev.Kind, ev.Seq
			var d event.RunFailedData
			t.sealed = ev.Kind == event.RunFailed && ev.DecodeData(&d) == nil && d.Code == event.CodeJournalCorrupt
		}
	}
}

// Receipt returns the unsigned receipt of the journal tallied, which must
// end at seq, its last message hashing to head (the chain head its
// reader or appender holds). The terminal event is in that last message:
// a sound journal holds nothing after it. A tally that does not reach
// seq, is broken or ends with a seal returns an error; one without a
// terminal event, ErrNotEnded.
func (t *Tally) Receipt(seq uint64, head string) (*Receipt, error) {
	r, err := t.receipt()
	switch {
	case err != nil:
		return nil, err
	case t.r.LastSeq != seq:
		return nil, fmt.Errorf("run %s: the tally ends at seq %d, the journal at %d", t.r.RunID, t.r.LastSeq, seq)
	case t.sealed:
		return nil, fmt.Errorf("run %s: the journal is sealed: only its messages say how many it has", t.r.RunID)
	}
	r.Messages, r.JournalDigest, r.TerminalEventHash = t.messages, head, head
	return r, nil
}

// receipt is the receipt of the events taken, without what only the
// messages' bytes say.
func (t *Tally) receipt() (*Receipt, error) {
	if t.broken != "" {
		return nil, fmt.Errorf("run %s: the events tallied are not its journal: %s", t.r.RunID, t.broken)
	}
	if t.r.TerminalKind == "" {
		return nil, ErrNotEnded
	}
	r := t.r
	r.Status = status(r.TerminalKind)
	r.InputTokens, r.OutputTokens = t.usage.InputTokens, t.usage.OutputTokens
	r.CostUSD = fmt.Sprintf("%.6f", t.usage.CostUSD)
	return &r, nil
}

func status(k event.Kind) string {
	switch k {
	case event.RunSucceeded:
		return "succeeded"
	case event.RunFailed:
		return "failed"
	default:
		return "cancelled"
	}
}

// Canonical returns the bytes the signature covers: r without its
// signature as JSON with keys sorted and no insignificant space.
func Canonical(r *Receipt) ([]byte, error) {
	cp := *r
	cp.Signature = ""
	raw, err := json.Marshal(cp)
	if err != nil {
		return nil, err
	}
	// Through a map so the keys come out sorted (encoding/json sorts map
	// keys); numbers stay the literals they were.
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&m); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(m); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// Sign sets r's key id, algorithm, signed_at (now, UTC, whole
// milliseconds) and signature.
func (k *Key) Sign(r *Receipt, now time.Time) error {
	r.KeyID, r.Alg = k.ID, Alg
	r.SignedAt = now.UTC().Truncate(time.Millisecond)
	msg, err := Canonical(r)
	if err != nil {
		return err
	}
	r.Signature = base64.StdEncoding.EncodeToString(ed25519.Sign(k.Private, msg))
	return nil
}

// VerifyError is a receipt that does not match: a bad signature, an
// unknown key, or a journal that differs from the one signed. Seq, when
// not 0, is the first event that does not verify.
type VerifyError struct {
	Seq    uint64
	Reason string
}

func (e *VerifyError) Error() string {
	if e.Seq != 0 {
		return fmt.Sprintf("receipt does not match at seq %d: %s", e.Seq, e.Reason)
	}
	return "receipt does not match: " + e.Reason
}

// Verify checks r's signature with the key of r.KeyID among keys, then
// recomputes the receipt from msgs (the exported journal) and compares.
// It returns nil or a *VerifyError.
func Verify(r *Receipt, keys []PublicKey, msgs [][]byte) error {
	if err := VerifySignature(r, keys); err != nil {
		return err
	}
	return Match(r, msgs)
}

// VerifySignature checks r's signature with the key of r.KeyID among
// keys, and nothing else: whoever serves a stored receipt checks it is
// PAL's this way. It returns nil or a *VerifyError.
func VerifySignature(r *Receipt, keys []PublicKey) error {
	var pub ed25519.PublicKey
	for _, k := range keys {
		if k.ID == r.KeyID {
			pub = k.Public
		}
	}
	if pub == nil {
		return &VerifyError{Reason: fmt.Sprintf("signed with key %q, which is not among the public keys given", clipID(r.KeyID))}
	}
	if r.Alg != Alg {
		return &VerifyError{Reason: fmt.Sprintf("algorithm %q, want %s", clipID(r.Alg), Alg)}
	}
	sig, err := base64.StdEncoding.DecodeString(r.Signature)
	if err != nil || len(sig) != ed25519.SignatureSize {
		return &VerifyError{Reason: "the signature is not base64 of an Ed25519 signature"}
	}
	msg, err := Canonical(r)
	if err != nil {
		return &VerifyError{Reason: err.Error()}
	}
	if !ed25519.Verify(pub, msg, sig) {
		return &VerifyError{Reason: fmt.Sprintf("the signature does not verify with key %s: the receipt was changed or signed by another key", r.KeyID)}
	}
	return nil
}

// clipID bounds a stored receipt's field in a reason.
func clipID(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// Match reports whether r describes the journal msgs, naming the first
// event that differs.
func Match(r *Receipt, msgs [][]byte) error {
	got, err := Build(r.RunID, msgs)
	if err == nil && got.JournalDigest == r.JournalDigest && got.TerminalEventHash == r.TerminalEventHash {
		want := *r
		got.KeyID, got.Alg, got.SignedAt, got.Signature = r.KeyID, r.Alg, r.SignedAt, r.Signature
		if *got != want {
			return &VerifyError{Reason: fmt.Sprintf("the journal's totals differ from the receipt's: %v", diff(got, &want))}
		}
		return nil
	}
	if len(msgs) == 0 {
		return &VerifyError{Reason: "the journal is empty"}
	}
	return locate(r, msgs)
}

// locate names the first changed event of a journal that does not match
// its receipt. A message's bytes are covered by the next message's prev,
// so a changed message shows as a bad prev one message later: the event
// named is the one in the message before, unless the next message shows
// that the one with the bad prev was changed itself. The last message is
// covered only by the receipt's journal digest.
func locate(r *Receipt, msgs [][]byte) error {
	c := &event.Chain{RunID: r.RunID}
	for i, body := range msgs {
		if _, err := c.Next(body); err == nil {
			continue
		}
		ce := c.Corrupt
		prevChanged := i > 0 && prevMismatch(msgs[i-1], body)
		if prevChanged && (i+1 == len(msgs) || prevOf(msgs[i+1]) == event.Hash(body)) {
			// The message with the bad prev is intact; the one before it
			// is not what was chained.
			return &VerifyError{Seq: firstSeq(msgs[i-1], ce.Seq-1),
				Reason: "this message's bytes are not the ones the next message's prev names: it was changed"}
		}
		return &VerifyError{Seq: ce.Seq, Reason: ce.Reason}
	}
	last := msgs[len(msgs)-1]
	return &VerifyError{Seq: firstSeq(last, c.Seq),
		Reason: fmt.Sprintf("the journal's chain head is %s, the receipt's %s: the last message was changed, or the journal was cut or extended", c.Hash, r.JournalDigest)}
}

// prevMismatch reports whether body decodes and its prev is not the hash
// of before.
func prevMismatch(before, body []byte) bool {
	evs, err := event.Decode(body)
	return err == nil && evs[0].Prev != event.Hash(before)
}

func prevOf(body []byte) string {
	evs, err := event.Decode(body)
	if err != nil {
		return ""
	}
	return evs[0].Prev
}

// firstSeq is the seq of body's first event, or fallback when it does not
// decode.
func firstSeq(body []byte, fallback uint64) uint64 {
	evs, err := event.Decode(body)
	if err != nil {
		return fallback
	}
	return evs[0].Seq
}

func diff(a, b *Receipt) map[string][2]any {
	out := map[string][2]any{}
	add := func(name string, x, y any) {
		if x != y {
			out[name] = [2]any{x, y}
		}
	}
	add("workflow", a.Workflow, b.Workflow)
	add("status", a.Status, b.Status)
	add("first_seq", a.FirstSeq, b.FirstSeq)
	add("last_seq", a.LastSeq, b.LastSeq)
	add("events", a.Events, b.Events)
	add("messages", a.Messages, b.Messages)
	add("input_tokens", a.InputTokens, b.InputTokens)
	add("output_tokens", a.OutputTokens, b.OutputTokens)
	add("cost_usd", a.CostUSD, b.CostUSD)
	add("v", a.V, b.V)
	return out
}
