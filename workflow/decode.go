package workflow

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// jsonError is a malformed document, located by line and column.
type jsonError struct {
	line, column int
	msg          string
}

func (e *jsonError) Error() string {
	return fmt.Sprintf("invalid JSON at line %d column %d: %s", e.line, e.column, e.msg)
}

// position returns the 1-based line and column (in characters) of byte
// offset off in raw.
func position(raw []byte, off int) (line, column int) {
	off = max(0, min(off, len(raw)))
	before := raw[:off]
	line = bytes.Count(before, []byte("\n")) + 1
	start := bytes.LastIndexByte(before, '\n') + 1
	return line, utf8.RuneCount(before[start:]) + 1
}

func errorAt(raw []byte, off int, format string, args ...any) *jsonError {
	line, col := position(raw, off)
	return &jsonError{line: line, column: col, msg: fmt.Sprintf(format, args...)}
}

// decodeDocument decodes raw as one JSON value, with numbers as
// json.Number. Beyond what encoding/json checks, it refuses duplicate object
// keys (which would otherwise silently keep the last) and nesting deeper
// than maxDepth.
func decodeDocument(raw []byte) (any, error) {
	// A first pass for syntax: its error offsets are exact.
	if err := json.Unmarshal(raw, new(json.RawMessage)); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			off := int(se.Offset)
			msg := se.Error()
			if strings.HasPrefix(msg, "unexpected end of JSON input") {
				msg = "unexpected end of input"
			} else {
				off-- // the offending character
			}
			return nil, errorAt(raw, off, "%s", msg)
		}
		return nil, errorAt(raw, 0, "%v", err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	d := docDecoder{raw: raw, dec: dec}
	return d.value(0)
}

type docDecoder struct {
	raw []byte
	dec *json.Decoder
}

func (d *docDecoder) value(depth int) (any, error) {
	start := d.dec.InputOffset()
	tok, err := d.dec.Token()
	if err != nil {
		return nil, errorAt(d.raw, int(start), "%v", err)
	}
	delim, ok := tok.(json.Delim)
	if !ok {
		return tok, nil
	}
	if depth >= maxDepth {
		return nil, errorAt(d.raw, d.skipSpace(start), "nested deeper than %d levels", maxDepth)
	}
	switch delim {
	case '{':
		obj := map[string]any{}
		for d.dec.More() {
			keyAt := d.skipSpace(d.dec.InputOffset())
			kt, err := d.dec.Token()
			if err != nil {
				return nil, errorAt(d.raw, keyAt, "%v", err)
			}
			key, _ := kt.(string)
			if _, dup := obj[key]; dup {
				return nil, errorAt(d.raw, keyAt, "duplicate key %q", key)
			}
			v, err := d.value(depth + 1)
			if err != nil {
				return nil, err
			}
			obj[key] = v
		}
		if _, err := d.dec.Token(); err != nil {
			return nil, errorAt(d.raw, int(d.dec.InputOffset()), "%v", err)
		}
		return obj, nil
	default: // '['
		arr := []any{}
		for d.dec.More() {
			v, err := d.value(depth + 1)
			if err != nil {
				return nil, err
			}
			arr = append(arr, v)
		}
		if _, err := d.dec.Token(); err != nil {
			return nil, errorAt(d.raw, int(d.dec.InputOffset()), "%v", err)
		}
		return arr, nil
	}
}

// skipSpace returns the offset of the next token at or after off, past
// whitespace, ',' and ':'.
func (d *docDecoder) skipSpace(off int64) int {
	i := int(off)
	for i < len(d.raw) {
		switch d.raw[i] {
		case ' ', '\t', '\n', '\r', ',', ':':
			i++
			continue
		}
		break
	}
	return i
}
