package event

import (
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

// MaxBlobBytes bounds one value kept as a blob: a reader holds it in
// memory, and a forged reference cannot make it read more.
const MaxBlobBytes = 64 << 20

// BlobSuffix ends the name of the data field that carries a BlobRef.
const BlobSuffix = "_blob"

// ErrBlob is matched by every refused blob reference: a malformed one, or
// bytes that are not what it names.
var ErrBlob = errors.New("bad blob reference")

// blobFields names, per kind, the one data field that may be a blob: the
// step values that can be big. Other fields are bounded where they are made.
var blobFields = map[Kind]string{
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

// Externalize returns ev with its blob field replaced by a reference when
// that field's JSON is longer than threshold bytes, and the value to keep
// (nil when ev stays as it is). It is a pure function of ev: the same event
// always gives the same bytes, so a re-sent append is recognised.
func Externalize(ev Event, threshold int) (Event, []byte, error) {
	field := blobFields[ev.Kind]
	if field == "" || len(ev.Data) <= threshold {
		return ev, nil, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(ev.Data, &m); err != nil {
		return ev, nil, fmt.Errorf("encoding %s data: %w", ev.Kind, err)
	}
	value, ok := m[field]
	if !ok || len(value) <= threshold {
		return ev, nil, nil
	}
	if len(value) > MaxBlobBytes {
		return ev, nil, fmt.Errorf("%s %s is %d bytes; a value is at most %d bytes", ev.Kind, field, len(value), MaxBlobBytes)
	}
	ref, _ := json.Marshal(BlobRef{Blob: BlobSum(value), Size: int64(len(value))})
	delete(m, field)
	m[field+BlobSuffix] = ref
	data, err := json.Marshal(m)
	if err != nil {
		return ev, nil, fmt.Errorf("encoding %s data: %w", ev.Kind, err)
	}
	ev.Data = data
	return ev, value, nil
}

// BlobOf returns the reference ev carries, if any, checked for shape: a
// sha256 in lowercase hex and a size within MaxBlobBytes. An event with both
// the value and a reference is refused.
func BlobOf(ev Event) (BlobRef, bool, error) {
	field := blobFields[ev.Kind]
	if field == "" || len(ev.Data) == 0 {
		return BlobRef{}, false, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(ev.Data, &m); err != nil {
		return BlobRef{}, false, nil // not an object: the fold reports it
	}
	raw, ok := m[field+BlobSuffix]
	if !ok {
		return BlobRef{}, false, nil
	}
	var ref BlobRef
	if err := json.Unmarshal(raw, &ref); err != nil {
		return ref, true, fmt.Errorf("%w: run %s seq %d: %v", ErrBlob, ev.RunID, ev.Seq, err)
	}
	if _, dup := m[field]; dup {
		return ref, true, fmt.Errorf("%w: run %s seq %d carries both %s and %s%s", ErrBlob, ev.RunID, ev.Seq, field, field, BlobSuffix)
	}
	if !isSum(ref.Blob) || ref.Size <= 0 || ref.Size > MaxBlobBytes {
		return ref, true, fmt.Errorf("%w: run %s seq %d: blob %.80q of %d bytes (want 64 lowercase hex, 1 to %d bytes)",
			ErrBlob, ev.RunID, ev.Seq, ref.Blob, ref.Size, MaxBlobBytes)
	}
	return ref, true, nil
}

// Resolve returns ev with the value of its reference in place, after
// checking that value is what the reference names: its size, its sha256,
// and that it is JSON. Anything else is refused (ErrBlob).
func Resolve(ev Event, value []byte) (Event, error) {
	ref, ok, err := BlobOf(ev)
	if err != nil || !ok {
		return ev, err
	}
	if int64(len(value)) != ref.Size || BlobSum(value) != ref.Blob {
		return ev, fmt.Errorf("%w: run %s seq %d: the stored bytes of blob %s do not match its hash", ErrBlob, ev.RunID, ev.Seq, ref.Blob)
	}
	if !json.Valid(value) {
		return ev, fmt.Errorf("%w: run %s seq %d: blob %s is not JSON", ErrBlob, ev.RunID, ev.Seq, ref.Blob)
	}
	var m map[string]json.RawMessage
	_ = json.Unmarshal(ev.Data, &m) // BlobOf decoded it
	field := blobFields[ev.Kind]
	delete(m, field+BlobSuffix)
	m[field] = value
	data, err := json.Marshal(m)
	if err != nil {
		return ev, fmt.Errorf("resolving run %s seq %d: %w", ev.RunID, ev.Seq, err)
	}
	ev.Data = data
	return ev, nil
}

func isSum(s string) bool {
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
