package projections

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/palrun/pal/event"
)

// journalRow is a row of journal_events.
type journalRow struct {
	RunID     string
	Seq       uint64
	Kind      string
	StepID    string
	Attempt   int
	WorkerID  string
	Data      json.RawMessage
	StreamSeq uint64
	TS        time.Time
}

func journalRowOf(ev event.Event, streamSeq uint64) journalRow {
	return journalRow{
		RunID: ev.RunID, Seq: ev.Seq, Kind: string(ev.Kind), StepID: ev.StepID, Attempt: ev.Attempt,
		WorkerID: ev.WorkerID, Data: ev.Data, StreamSeq: streamSeq, TS: ev.TS,
	}
}

// Postgres refuses some values that JSON and Go strings allow: a NUL
// character in text or jsonb, a lone UTF-16 surrogate in jsonb, invalid
// UTF-8 anywhere. A journal event carrying one (an LLM's output, say) must
// not stop the projector, so such values are stored with U+FFFD in place of
// the offending character. Everything else is stored as the journal has it.

// cleanText returns s as a Postgres text value accepts it.
func cleanText(s string) string {
	if strings.IndexByte(s, 0) < 0 && utf8.ValidString(s) {
		return s
	}
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

// cleanJSON returns raw as a Postgres jsonb value accepts it, or nil for an
// absent value.
func cleanJSON(raw json.RawMessage) []byte {
	if len(raw) == 0 {
		return nil
	}
	if utf8.Valid(raw) && !hasBadEscape(raw) {
		return raw
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		// Not JSON at all (the envelope decoder would not let this
		// through): keep it as a string.
		v = string(raw)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(scrub(v)); err != nil {
		return []byte("null")
	}
	return bytes.TrimRight(buf.Bytes(), "\n")
}

// scrub replaces NUL characters and invalid UTF-8 in every string and key
// of a decoded JSON value (decoding already turned lone surrogates into
// U+FFFD).
func scrub(v any) any {
	switch x := v.(type) {
	case string:
		return cleanText(x)
	case []any:
		for i := range x {
			x[i] = scrub(x[i])
		}
		return x
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[cleanText(k)] = scrub(e)
		}
		return out
	default:
		return v
	}
}

// hasBadEscape reports whether raw holds a \u escape that jsonb refuses or
// may refuse: \u0000 or a UTF-16 surrogate (valid pairs are rewritten as
// the character they encode, which is the same value).
func hasBadEscape(raw []byte) bool {
	for i := 0; i+5 < len(raw); i++ {
		if raw[i] != '\\' {
			continue
		}
		if raw[i+1] != 'u' {
			i++ // skip the escaped character (it may be a backslash)
			continue
		}
		var n rune
		for _, c := range raw[i+2 : i+6] {
			n <<= 4
			switch {
			case c >= '0' && c <= '9':
				n |= rune(c - '0')
			case c >= 'a' && c <= 'f':
				n |= rune(c - 'a' + 10)
			case c >= 'A' && c <= 'F':
				n |= rune(c - 'A' + 10)
			default:
				return true // not an escape JSON allows; let the slow path decide
			}
		}
		if n == 0 || (n >= 0xD800 && n <= 0xDFFF) {
			return true
		}
		i += 5
	}
	return false
}

// int32Of clamps n into an integer column's range.
func int32Of(n int) int32 {
	return int32(max(min(n, math.MaxInt32), math.MinInt32))
}

// fitsInt32 reports whether n fits an integer column without clamping.
func fitsInt32(n int) bool { return n >= math.MinInt32 && n <= math.MaxInt32 }
