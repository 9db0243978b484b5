package event

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
)

// Labels are the string pairs a start gives a run ({"customer": "acme"}),
// journaled in run_created and searched by listings (GET /v1/runs?label=).
// They are bounded so that a run_created, a projection row and a filter
// stay small whatever a client sends:
//
//   - at most MaxLabels labels;
//   - a key is 1 to MaxLabelKeyBytes of a-z, 0-9, '_', '.', '-', starting
//     with a letter (so it is safe in a URL, a shell and a JSON path);
//   - a value is at most MaxLabelValueBytes bytes of UTF-8 without control
//     characters, and may be empty.
//
// schemas/event.schema.json ($defs/labels) states the same bounds. A fork
// or retry carries its source's labels, a child run its parent's.
const (
	MaxLabels          = 16
	MaxLabelKeyBytes   = 63
	MaxLabelValueBytes = 256
)

var labelKey = regexp.MustCompile(`^[a-z][a-z0-9_.-]{0,62}$`)

// CheckLabelKey says what is wrong with label key k, or nil.
func CheckLabelKey(k string) error {
	if !labelKey.MatchString(k) {
		return fmt.Errorf("label key %q: want 1 to %d of a-z, 0-9, '_', '.', '-', starting with a letter", truncate(k), MaxLabelKeyBytes)
	}
	return nil
}

// CheckLabelValue says what is wrong with the value v of label key k, or
// nil.
func CheckLabelValue(k, v string) error {
	if len(v) > MaxLabelValueBytes {
		return fmt.Errorf("label %s: value is %d bytes; the limit is %d", k, len(v), MaxLabelValueBytes)
	}
	for _, r := range v {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("label %s: value has control character %U", k, r)
		}
	}
	return nil
}

// CheckLabels says what is wrong with labels, or nil; keys are checked in
// sorted order, so the same labels always give the same error.
func CheckLabels(labels map[string]string) error {
	if len(labels) > MaxLabels {
		return fmt.Errorf("%d labels; the limit is %d", len(labels), MaxLabels)
	}
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		if err := CheckLabelKey(k); err != nil {
			return err
		}
		if err := CheckLabelValue(k, labels[k]); err != nil {
			return err
		}
	}
	return nil
}
