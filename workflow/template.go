package workflow

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Env is what templates and conditions see: the run's input and the outputs
// of the steps that completed so far.
type Env struct {
	// Input is the run input, as decoded from JSON (with UseNumber) or as a
	// json.RawMessage.
	Input any
	// Steps maps a node id to that step's output, as decoded from JSON (with
	// UseNumber) or as a json.RawMessage. A template reads it as
	// steps.<id>.output.
	Steps map[string]any
	// Failed maps the id of a node whose step failed and whose run went on
	// (onFailure "continue") to the step's error. A condition reads it as
	// steps.<id>.status == "failed" and steps.<id>.error; a step in Steps
	// has status "completed".
	Failed map[string]string
}

// segment is one step of a template path: a field name or an array index.
type segment struct {
	field   string
	index   int
	isIndex bool
}

// placeholder is one {{path}} of a template.
type placeholder struct {
	path []segment
}

// String returns the placeholder in canonical form, "{{steps.a.output.b[0]}}".
func (p placeholder) String() string { return "{{" + pathString(p.path) + "}}" }

// template is a parsed template: literal text around placeholders.
// len(lits) == len(phs)+1.
type template struct {
	lits []string
	phs  []placeholder
}

// single reports whether the template is exactly one placeholder with no
// text around it.
func (t *template) single() bool {
	return len(t.phs) == 1 && t.lits[0] == "" && t.lits[1] == ""
}

// TemplateSyntaxError reports a malformed template, or one past
// MaxTemplateBytes or MaxTemplatePlaceholders.
type TemplateSyntaxError struct {
	// Offset is the byte offset of the problem in the template; -1 when
	// the problem is the whole template.
	Offset  int
	Message string
}

func (e *TemplateSyntaxError) Error() string {
	if e.Offset < 0 {
		return "template: " + e.Message
	}
	return fmt.Sprintf("template: %s at character %d", e.Message, e.Offset+1)
}

// errRenderSize is the error of a rendering that would produce more than
// MaxRenderBytes.
var errRenderSize = fmt.Errorf("%w: the rendered text is over %d bytes", ErrEvalLimit, MaxRenderBytes)

// parseTemplate parses s. A placeholder is "{{", a path, "}}", with spaces
// allowed inside the braces; `\{{` is a literal "{{".
func parseTemplate(s string) (*template, error) {
	if len(s) > MaxTemplateBytes {
		return nil, &TemplateSyntaxError{Offset: -1,
			Message: fmt.Sprintf("%d bytes, longer than the %d allowed for a string with placeholders", len(s), MaxTemplateBytes)}
	}
	t := &template{}
	var lit strings.Builder
	i := 0
	for {
		j := strings.Index(s[i:], "{{")
		if j < 0 {
			lit.WriteString(s[i:])
			break
		}
		j += i
		if j > 0 && s[j-1] == '\\' {
			lit.WriteString(s[i : j-1])
			lit.WriteString("{{")
			i = j + 2
			continue
		}
		lit.WriteString(s[i:j])
		k := strings.Index(s[j+2:], "}}")
		if k < 0 {
			return nil, &TemplateSyntaxError{Offset: j, Message: `unclosed "{{"`}
		}
		inner := s[j+2 : j+2+k]
		path, err := parsePath(inner)
		if err != nil {
			return nil, &TemplateSyntaxError{Offset: j, Message: fmt.Sprintf("invalid placeholder %q: %v", s[j:j+4+k], err)}
		}
		if len(t.phs) == MaxTemplatePlaceholders {
			return nil, &TemplateSyntaxError{Offset: j, Message: fmt.Sprintf("more than %d placeholders", MaxTemplatePlaceholders)}
		}
		t.lits = append(t.lits, lit.String())
		lit.Reset()
		t.phs = append(t.phs, placeholder{path: path})
		i = j + 4 + k
	}
	t.lits = append(t.lits, lit.String())
	return t, nil
}

func isNameRune(r rune) bool {
	return r == '_' || r == '-' || unicode.IsLetter(r) || unicode.IsDigit(r)
}

// parsePath parses a dotted path with optional [n] indexes:
// "steps.fetch.output.items[0].url".
func parsePath(s string) ([]segment, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, errors.New("empty path")
	}
	var path []segment
	i := 0
	expectName := true
	for i < len(s) {
		switch {
		case expectName:
			j := i
			for j < len(s) {
				r, n := utf8.DecodeRuneInString(s[j:])
				if !isNameRune(r) {
					break
				}
				j += n
			}
			if j == i {
				r, _ := utf8.DecodeRuneInString(s[i:])
				if r == '.' || r == '[' {
					return nil, errors.New("empty name in path")
				}
				return nil, fmt.Errorf("unexpected %q in path (names use letters, digits, '_' and '-')", r)
			}
			path = append(path, segment{field: s[i:j]})
			i = j
			expectName = false
		case s[i] == '.':
			i++
			expectName = true
			if i == len(s) {
				return nil, errors.New("path ends with '.'")
			}
		case s[i] == '[':
			j := strings.IndexByte(s[i:], ']')
			if j < 0 {
				return nil, errors.New("unclosed '['")
			}
			digits := s[i+1 : i+j]
			n, err := strconv.Atoi(digits)
			if err != nil || n < 0 || digits == "" || strings.ContainsAny(digits, "+-") {
				return nil, fmt.Errorf("invalid index [%s] (want a number from 0)", digits)
			}
			path = append(path, segment{index: n, isIndex: true})
			i += j + 1
		default:
			r, _ := utf8.DecodeRuneInString(s[i:])
			return nil, fmt.Errorf("unexpected %q in path", r)
		}
	}
	return path, nil
}

func pathString(path []segment) string {
	var b strings.Builder
	for i, seg := range path {
		if seg.isIndex {
			b.WriteByte('[')
			b.WriteString(strconv.Itoa(seg.index))
			b.WriteByte(']')
			continue
		}
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(seg.field)
	}
	return b.String()
}

// Template roots.
const (
	rootInput   = "input"
	rootSteps   = "steps"
	rootSecrets = "secrets"
	fieldOut    = "output"
	// fieldStatus and fieldError are what a condition reads besides a
	// step's output: "completed" or "failed", and a failed step's error
	// (a node with onFailure "continue").
	fieldStatus = "status"
	fieldError  = "error"
)

// checkPathShape checks that a path starts with input or steps.<id>.output,
// or is secrets.<name>.
func checkPathShape(path []segment) error {
	switch path[0].field {
	case rootInput:
		return nil
	case rootSecrets:
		if len(path) != 2 || path[1].isIndex {
			return errors.New("want secrets.<name>")
		}
		return nil
	case rootSteps:
		if len(path) < 2 || path[1].isIndex {
			return errors.New("want steps.<node id>.output…")
		}
		if len(path) < 3 || path[2].isIndex || path[2].field != fieldOut {
			got := "nothing"
			if len(path) >= 3 {
				got = strconv.Quote(pathString(path[2:3]))
				if path[2].isIndex {
					got = "an index"
				}
			}
			return fmt.Errorf("steps.%s has no field %s (want steps.%s.output…)", path[1].field, got, path[1].field)
		}
		return nil
	default:
		return fmt.Errorf("unknown name %q (a template starts with input, steps or secrets)", path[0].field)
	}
}

// TemplateError reports a placeholder whose value cannot be found.
type TemplateError struct {
	// Placeholder is the placeholder in canonical form, "{{input.text}}".
	Placeholder string
	Err         error
}

func (e *TemplateError) Error() string {
	return "template " + e.Placeholder + ": " + e.Err.Error()
}

func (e *TemplateError) Unwrap() error { return e.Err }

// resolver looks values up in an Env for one rendering, decoding each raw
// step output (and the input) at most once.
type resolver struct {
	env     Env
	decoded map[string]any // "" for the input, else node id
}

func newResolver(env Env) *resolver { return &resolver{env: env, decoded: map[string]any{}} }

func (r *resolver) root(key string, v any) (any, error) {
	if d, ok := r.decoded[key]; ok {
		return d, nil
	}
	d, err := normalize(v)
	if err != nil {
		return nil, err
	}
	r.decoded[key] = d
	return d, nil
}

// resolve finds the value of path.
func (r *resolver) resolve(path []segment) (any, error) {
	if err := checkPathShape(path); err != nil {
		return nil, err
	}
	if path[0].field == rootSecrets {
		// A secret is not rendered: the reference stays, so the journal
		// never holds the value. The worker resolves it as it sends.
		return placeholder{path: path}.String(), nil
	}
	key, raw, k := "", r.env.Input, 1 // k: how many segments of path cur stands for
	if path[0].field == rootSteps {
		id := path[1].field
		out, ok := r.env.Steps[id]
		if !ok {
			return nil, fmt.Errorf("no output for step %q", id)
		}
		key, raw, k = id, out, 3
	}
	cur, err := r.root(key, raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", pathString(path[:k]), err)
	}
	for ; k < len(path); k++ {
		seg := path[k]
		at := pathString(path[:k])
		v, err := normalize(cur)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", at, err)
		}
		switch x := v.(type) {
		case map[string]any:
			if seg.isIndex {
				return nil, fmt.Errorf("%s is an object, not an array", at)
			}
			next, ok := x[seg.field]
			if !ok {
				return nil, fmt.Errorf("%s has no field %q", at, seg.field)
			}
			cur = next
		case []any:
			if !seg.isIndex {
				return nil, fmt.Errorf("%s is an array, not an object (no field %q)", at, seg.field)
			}
			if seg.index >= len(x) {
				return nil, fmt.Errorf("%s has no index %d (length %d)", at, seg.index, len(x))
			}
			cur = x[seg.index]
		default:
			want := "an object"
			if seg.isIndex {
				want = "an array"
			}
			return nil, fmt.Errorf("%s is %s, not %s", at, jsonTypeName(v), want)
		}
	}
	v, err := normalize(cur)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", pathString(path), err)
	}
	return v, nil
}

// jsonTypeName names the JSON type of a normalized value, with an article.
func jsonTypeName(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case json.Number, float64, float32, int, int64, int32, uint, uint64, uint32:
		return "a number"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	default:
		return fmt.Sprintf("a %T", v)
	}
}

// normalize returns v in the form encoding/json decodes to with UseNumber
// (map[string]any, []any, string, json.Number, bool, nil), one level deep.
// Go numbers are kept as they are. Other values (json.RawMessage, structs,
// typed maps and slices) go through JSON.
func normalize(v any) (any, error) {
	switch x := v.(type) {
	case nil, string, bool, json.Number, map[string]any, []any,
		float64, float32, int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64:
		return v, nil
	case json.RawMessage:
		return decodeUseNumber(x)
	default:
		b, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("value of type %T is not JSON: %w", v, err)
		}
		return decodeUseNumber(b)
	}
}

func decodeUseNumber(b []byte) (any, error) {
	if len(bytes.TrimSpace(b)) == 0 {
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("invalid JSON value: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("invalid JSON value: data after the value")
	}
	return v, nil
}

// marshalCompact writes v as compact JSON without HTML escaping.
func marshalCompact(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// stringify renders a value embedded in text: strings as they are, numbers
// as written, anything else as compact JSON.
func stringify(v any) (string, error) {
	switch x := v.(type) {
	case string:
		return x, nil
	case json.Number:
		return x.String(), nil
	case nil:
		return "null", nil
	case bool:
		return strconv.FormatBool(x), nil
	}
	b, err := marshalCompact(v)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

func (t *template) render(r *resolver) (string, error) {
	if len(t.phs) == 0 {
		return t.lits[0], nil
	}
	var b strings.Builder
	for i, ph := range t.phs {
		b.WriteString(t.lits[i])
		v, err := r.resolve(ph.path)
		if err != nil {
			return "", &TemplateError{Placeholder: ph.String(), Err: err}
		}
		s, err := stringify(v)
		if err != nil {
			return "", &TemplateError{Placeholder: ph.String(), Err: err}
		}
		// Checked as the text grows, so that many placeholders of one
		// big value stop at the first that goes past the limit.
		if b.Len()+len(s) > MaxRenderBytes {
			return "", &TemplateError{Placeholder: ph.String(), Err: errRenderSize}
		}
		b.WriteString(s)
	}
	b.WriteString(t.lits[len(t.lits)-1])
	return b.String(), nil
}

// RenderString replaces every {{path}} in s with the value it names in env.
// Strings are inserted as they are, numbers as written, other values as
// compact JSON. `\{{` is a literal "{{". It returns a *TemplateSyntaxError
// for a malformed template and a *TemplateError naming the path for a value
// that is missing:
//
//	template {{steps.draft.output.txt}}: steps.draft.output has no field "txt"
//
// Rendering is pure: the same s and env always give the same result.
func RenderString(s string, env Env) (string, error) {
	if !strings.Contains(s, "{{") {
		return s, nil
	}
	t, err := parseTemplate(s)
	if err != nil {
		return "", err
	}
	return t.render(newResolver(env))
}

// RenderJSON renders every string in the JSON value v (object keys excepted)
// as a template. A string that is exactly one placeholder, like
// "{{steps.fetch.output}}", becomes the value itself (a number stays a
// number, an object an object); any other string is rendered as by
// RenderString. Object keys keep their order. An empty v is returned as is.
// Errors name the location inside v: `items[1].url: template {{…}}: …`.
func RenderJSON(v json.RawMessage, env Env) (json.RawMessage, error) {
	if len(bytes.TrimSpace(v)) == 0 {
		return v, nil
	}
	var out bytes.Buffer
	if !bytes.Contains(v, []byte("{{")) {
		// Nothing to render (most tool inputs): compacted as it is, not
		// walked token by token, which cost a step several µs.
		if err := json.Compact(&out, v); err != nil {
			return nil, fmt.Errorf("invalid JSON value: %w", err)
		}
		return out.Bytes(), nil
	}
	r := newResolver(env)
	err := walkJSON(v, func(loc string, s string) ([]byte, error) {
		raw, err := renderJSONString(s, r)
		if err == nil && out.Len()+len(raw) > MaxRenderBytes {
			err = errRenderSize
		}
		if err != nil && loc != "" {
			return nil, fmt.Errorf("%s: %w", loc, err)
		}
		return raw, err
	}, &out)
	if err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

func renderJSONString(s string, r *resolver) ([]byte, error) {
	if !strings.Contains(s, "{{") {
		return marshalCompact(s)
	}
	t, err := parseTemplate(s)
	if err != nil {
		return nil, err
	}
	if t.single() {
		v, err := r.resolve(t.phs[0].path)
		if err != nil {
			return nil, &TemplateError{Placeholder: t.phs[0].String(), Err: err}
		}
		b, err := marshalCompact(v)
		if err != nil {
			return nil, &TemplateError{Placeholder: t.phs[0].String(), Err: err}
		}
		return b, nil
	}
	rendered, err := t.render(r)
	if err != nil {
		return nil, err
	}
	return marshalCompact(rendered)
}

// walkJSON copies the JSON value v to out compactly, replacing each string
// value (not object keys) by what fn returns for it. fn gets the string's
// location ("body.items[1]", "" for the root).
func walkJSON(v []byte, fn func(loc, s string) ([]byte, error), out *bytes.Buffer) error {
	// Check the syntax first: the decoder's token errors are less precise.
	if err := json.Unmarshal(v, new(json.RawMessage)); err != nil {
		return fmt.Errorf("invalid JSON value: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(v))
	dec.UseNumber()
	if err := walkValue(dec, "", fn, out, 0); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("invalid JSON value: data after the value")
	}
	return nil
}

// maxDepth bounds the nesting of a workflow document.
const maxDepth = 1000

func walkValue(dec *json.Decoder, loc string, fn func(loc, s string) ([]byte, error), out *bytes.Buffer, depth int) error {
	if depth > MaxTemplateDepth {
		return fmt.Errorf("nested deeper than %d levels (the limit for a value holding templates)", MaxTemplateDepth)
	}
	tok, err := dec.Token()
	if err != nil {
		return fmt.Errorf("invalid JSON value: %w", err)
	}
	switch x := tok.(type) {
	case json.Delim:
		switch x {
		case '{':
			out.WriteByte('{')
			for n := 0; dec.More(); n++ {
				kt, err := dec.Token()
				if err != nil {
					return fmt.Errorf("invalid JSON value: %w", err)
				}
				key, _ := kt.(string)
				if n > 0 {
					out.WriteByte(',')
				}
				kb, err := marshalCompact(key)
				if err != nil {
					return err
				}
				out.Write(kb)
				out.WriteByte(':')
				if err := walkValue(dec, joinField(loc, key), fn, out, depth+1); err != nil {
					return err
				}
			}
			out.WriteByte('}')
		case '[':
			out.WriteByte('[')
			for n := 0; dec.More(); n++ {
				if n > 0 {
					out.WriteByte(',')
				}
				if err := walkValue(dec, loc+"["+strconv.Itoa(n)+"]", fn, out, depth+1); err != nil {
					return err
				}
			}
			out.WriteByte(']')
		}
		// The closing delimiter.
		if _, err := dec.Token(); err != nil {
			return fmt.Errorf("invalid JSON value: %w", err)
		}
	case string:
		b, err := fn(loc, x)
		if err != nil {
			return err
		}
		out.Write(b)
	case json.Number:
		out.WriteString(x.String())
	case bool:
		out.WriteString(strconv.FormatBool(x))
	case nil:
		out.WriteString("null")
	}
	return nil
}

// joinLoc appends a location inside a value to the field holding it:
// "data.body" + "items[1]" → "data.body.items[1]"; "data.body" + "[0]" →
// "data.body[0]".
func joinLoc(field, loc string) string {
	switch {
	case loc == "":
		return field
	case field == "", strings.HasPrefix(loc, "["):
		return field + loc
	}
	return field + "." + loc
}

// joinField appends an object key to a location: "body" + "x" → "body.x";
// keys that are not plain names are quoted: body["a b"].
func joinField(loc, key string) string {
	plain := key != ""
	for _, r := range key {
		if !isNameRune(r) {
			plain = false
			break
		}
	}
	if !plain {
		return loc + "[" + strconv.Quote(key) + "]"
	}
	if loc == "" {
		return key
	}
	return loc + "." + key
}
