package event

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
)

// Big values (docs/architecture.md §6.4). A step's input or output larger
// than the store's threshold is not journaled inline: its exact bytes go to
// the PAL_BLOBS object store under their sha256, and the event carries
// <field>_blob {"blob": "<sha256 hex>", "size": N} in place of <field>.
// The hash is in the journal, so the chain and a receipt cover the value.
// Readers of the store get the value back in <field> (Resolve).

// BlobRef names a value kept in PAL_BLOBS.
type BlobRef struct {
	// Blob is the hex sha256 of the value's bytes: the object's name.
	Blob string `json:"blob"`
	// Size is the value's length in bytes.
	Size int64 `json:"size"`
}

// Holds reports whether value is the bytes r names: its size and its
// sha256. Every reader of a blob checks it so, wherever the bytes came from.
func (r BlobRef) Holds(value []byte) bool {
	return int64(len(value)) == r.Size && BlobSum(value) == r.Blob
}

// MaxBlobBytes bounds one value kept as a blob: a reader holds it in
// memory, and a forged reference cannot make it read more.
const MaxBlobBytes = 64 << 20

// BlobSuffix ends the name of the data field that carries a BlobRef.
const BlobSuffix = "_blob"

// ErrBlob is matched by every refused blob reference: a malformed one, or
// bytes that are not what it names.
var ErrBlob = errors.New("bad blob reference")

// blobFields names, per kind, the one data field that may be a blob: the
// step values that can be big, and a run's input. Other fields are bounded
// where they are made. A fork's run_created may also keep the outputs it
// copies (forked_from.copies[].output) as blobs.
var blobFields = map[Kind]string{
	RunCreated:          "input",
	StepStarted:         "input",
	StepCompleted:       "output",
	ConfidenceEvaluated: "output",
	SubstepCompleted:    "output",
	RunSucceeded:        "output",
}

// BlobField is the data field of kind k that may be kept as a blob, or "".
func BlobField(k Kind) string { return blobFields[k] }

// BlobSum is the name of value in PAL_BLOBS: the hex sha256 of its bytes.
func BlobSum(value []byte) string {
	s := sha256.Sum256(value)
	return hex.EncodeToString(s[:])
}

// Externalize returns ev with each value longer than threshold bytes in a
// field that may be a blob replaced by its reference, and the values to
// keep (none when ev stays as it is). It is a pure function of ev: the same
// event always gives the same bytes, so a re-sent append is recognised.
func Externalize(ev Event, threshold int) (Event, [][]byte, error) {
	field := blobFields[ev.Kind]
	if field == "" || len(ev.Data) <= threshold {
		return ev, nil, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(ev.Data, &m); err != nil {
		return ev, nil, fmt.Errorf("encoding %s data: %w", ev.Kind, err)
	}
	values, err := keep(m, field, threshold, nil)
	if err != nil {
		return ev, nil, fmt.Errorf("%s %w", ev.Kind, err)
	}
	if ev.Kind == RunCreated {
		if err = eachCopy(m, func(c map[string]json.RawMessage) error {
			values, err = keep(c, "output", threshold, values)
			return err
		}); err != nil {
			return ev, nil, fmt.Errorf("%s forked_from.copies: %w", ev.Kind, err)
		}
	}
	if values == nil {
		return ev, nil, nil
	}
	data, err := json.Marshal(m)
	if err != nil {
		return ev, nil, fmt.Errorf("encoding %s data: %w", ev.Kind, err)
	}
	ev.Data = data
	return ev, values, nil
}

// keep moves m[field] to m[field_blob] when it is longer than threshold,
// adding its bytes to values.
func keep(m map[string]json.RawMessage, field string, threshold int, values [][]byte) ([][]byte, error) {
	value, ok := m[field]
	if !ok || len(value) <= threshold {
		return values, nil
	}
	if len(value) > MaxBlobBytes {
		return values, fmt.Errorf("%s is %d bytes; a value is at most %d bytes", field, len(value), MaxBlobBytes)
	}
	ref, _ := json.Marshal(BlobRef{Blob: BlobSum(value), Size: int64(len(value))})
	delete(m, field)
	m[field+BlobSuffix] = ref
	return append(values, value), nil
}

// eachCopy calls fn on each of run_created's forked_from.copies and
// writes back what fn changed. A run_created that is not shaped so is
// left to the fold to report.
func eachCopy(m map[string]json.RawMessage, fn func(map[string]json.RawMessage) error) error {
	var ff map[string]json.RawMessage
	if raw, ok := m["forked_from"]; !ok || json.Unmarshal(raw, &ff) != nil {
		return nil
	}
	var copies []map[string]json.RawMessage
	if raw, ok := ff["copies"]; !ok || json.Unmarshal(raw, &copies) != nil {
		return nil
	}
	for _, c := range copies {
		if err := fn(c); err != nil {
			return err
		}
	}
	var err error
	if ff["copies"], err = json.Marshal(copies); err != nil {
		return err
	}
	m["forked_from"], err = json.Marshal(ff)
	return err
}

// BlobOf returns the reference in ev's blob field, if any, checked for
// shape (refOf). Blobs lists every reference ev carries.
func BlobOf(ev Event) (BlobRef, bool, error) {
	refs, err := Blobs(ev)
	if err != nil || len(refs) == 0 || refs[0].copy {
		return BlobRef{}, false, err
	}
	return refs[0].BlobRef, true, nil
}

// NamedBlob is a reference and where in the event it stands.
type NamedBlob struct {
	BlobRef
	// Field is the data field it replaces: input, output, or
	// forked_from.copies[i].output.
	Field string
	copy  bool
}

// Blobs lists the references ev carries, each checked for shape: a sha256
// in lowercase hex and a size of 1 to MaxBlobBytes; a field carried both
// as a value and as a reference is refused (ErrBlob).
func Blobs(ev Event) ([]NamedBlob, error) {
	var out []NamedBlob
	_, err := rewrite(ev, func(m map[string]json.RawMessage, field, where string, isCopy bool) error {
		ref, ok, err := refOf(ev, m, field, where)
		if ok {
			out = append(out, NamedBlob{BlobRef: ref, Field: where, copy: isCopy})
		}
		return err
	})
	return out, err
}

// BlobUse is a blob a journal names, and the first event that names it.
type BlobUse struct {
	NamedBlob
	RunID string
	Seq   uint64
	// Msg is the journal message the event is in, counted from 1.
	Msg int
}

func (b BlobUse) String() string { return fmt.Sprintf("run %s seq %d %s", b.RunID, b.Seq, b.Field) }

// BlobSet gathers the distinct blobs a journal names, in its order: what
// retention releases and pal run export --blobs archives.
type BlobSet struct {
	Uses []BlobUse
	seen map[string]bool
}

// Add notes the blobs that evs, the events of journal message msg, name.
// The first malformed reference is returned (ErrBlob, naming its seq);
// the events after it are still read.
func (s *BlobSet) Add(evs []Event, msg int) (first error) {
	for _, ev := range evs {
		refs, err := Blobs(ev)
		if err != nil {
			if first == nil {
				first = err
			}
			continue
		}
		for _, r := range refs {
			if s.seen[r.Blob] {
				continue
			}
			if s.seen == nil {
				s.seen = map[string]bool{}
			}
			s.seen[r.Blob] = true
			s.Uses = append(s.Uses, BlobUse{NamedBlob: r, RunID: ev.RunID, Seq: ev.Seq, Msg: msg})
		}
	}
	return first
}

// Sums are the names of the blobs in s.
func (s *BlobSet) Sums() []string {
	out := make([]string, len(s.Uses))
	for i, u := range s.Uses {
		out[i] = u.Blob
	}
	return out
}

// rewrite calls fn on every place of ev that may hold a reference, and
// returns the data with what fn changed (nil when ev can hold none).
func rewrite(ev Event, fn func(m map[string]json.RawMessage, field, where string, isCopy bool) error) (json.RawMessage, error) {
	field := blobFields[ev.Kind]
	if field == "" || len(ev.Data) == 0 || !bytes.Contains(ev.Data, []byte(BlobSuffix)) {
		return nil, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(ev.Data, &m); err != nil {
		return nil, nil // not an object: the fold reports it
	}
	if err := fn(m, field, field, false); err != nil {
		return nil, err
	}
	if ev.Kind == RunCreated {
		i := 0
		if err := eachCopy(m, func(c map[string]json.RawMessage) error {
			i++
			return fn(c, "output", fmt.Sprintf("forked_from.copies[%d].output", i-1), true)
		}); err != nil {
			return nil, err
		}
	}
	return json.Marshal(m)
}

// refOf reads m[field_blob], if any, checked for shape.
func refOf(ev Event, m map[string]json.RawMessage, field, where string) (BlobRef, bool, error) {
	raw, ok := m[field+BlobSuffix]
	if !ok {
		return BlobRef{}, false, nil
	}
	var ref BlobRef
	if err := json.Unmarshal(raw, &ref); err != nil {
		return ref, true, fmt.Errorf("%w: run %s seq %d %s%s: %v", ErrBlob, ev.RunID, ev.Seq, where, BlobSuffix, err)
	}
	if _, dup := m[field]; dup {
		return ref, true, fmt.Errorf("%w: run %s seq %d carries both %s and %s%s", ErrBlob, ev.RunID, ev.Seq, where, where, BlobSuffix)
	}
	if !IsBlobSum(ref.Blob) || ref.Size <= 0 || ref.Size > MaxBlobBytes {
		return ref, true, fmt.Errorf("%w: run %s seq %d %s: blob %.80q of %d bytes (want 64 lowercase hex, 1 to %d bytes)",
			ErrBlob, ev.RunID, ev.Seq, where, ref.Blob, ref.Size, MaxBlobBytes)
	}
	return ref, true, nil
}

// Resolve returns ev with the value of each of its references in place,
// got from get and checked against the reference: its size, its sha256,
// and that it is JSON. Anything else is refused (ErrBlob).
func Resolve(ev Event, get func(BlobRef) ([]byte, error)) (Event, error) {
	changed := false
	data, err := rewrite(ev, func(m map[string]json.RawMessage, field, where string, _ bool) error {
		ref, ok, err := refOf(ev, m, field, where)
		if err != nil || !ok {
			return err
		}
		value, err := get(ref)
		if err != nil {
			return err
		}
		if !ref.Holds(value) {
			return fmt.Errorf("%w: run %s seq %d %s: the stored bytes of blob %s do not match its hash", ErrBlob, ev.RunID, ev.Seq, where, ref.Blob)
		}
		if !json.Valid(value) {
			return fmt.Errorf("%w: run %s seq %d %s: blob %s is not JSON", ErrBlob, ev.RunID, ev.Seq, where, ref.Blob)
		}
		delete(m, field+BlobSuffix)
		m[field] = value
		changed = true
		return nil
	})
	if err != nil || !changed {
		return ev, err
	}
	ev.Data = data
	return ev, nil
}

// IsBlobSum reports whether s is a blob's name: 64 lowercase hex digits.
func IsBlobSum(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
