package schemas

import (
	"errors"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

var printer = message.NewPrinter(language.English)

// Violation is one reason a document does not conform to a schema: a leaf of
// the validator's error tree.
type Violation struct {
	// Path is the location in the document, one element per object key or
	// array index: ["nodes", "2", "data", "model"]. Empty for the root.
	Path []string
	// Keyword is the failing keyword: "required", "additionalProperties",
	// "type", "enum", "const", "pattern", "minimum", "minLength", … For a
	// failed "anyOf" whose alternatives each require a property, Keyword is
	// "required" and Alternatives is true.
	Keyword string
	// SchemaURL is the absolute location of the failing keyword's schema, e.g.
	// ".../workflow.schema.json#/$defs/aiStepData". Lookup resolves it.
	SchemaURL string
	// Kind carries the details, as one of the types of package
	// github.com/santhosh-tekuri/jsonschema/v6/kind (*kind.Required{Missing},
	// *kind.AdditionalProperties{Properties}, *kind.Enum{Got, Want}, …).
	Kind jsonschema.ErrorKind
	// Alternatives reports that Kind is a *kind.Required whose Missing
	// properties are alternatives: any one of them would do.
	Alternatives bool
	// Message is the validator's own wording.
	Message string
}

// Pointer returns Path as a JSON pointer ("" for the root).
func (v Violation) Pointer() string {
	var b strings.Builder
	for _, p := range v.Path {
		b.WriteByte('/')
		b.WriteString(strings.NewReplacer("~", "~0", "/", "~1").Replace(p))
	}
	return b.String()
}

// String renders the violation as "pointer: message", e.g.
// "/nodes/1/data: missing property 'model'".
func (v Violation) String() string {
	p := v.Pointer()
	if p == "" {
		p = "/"
	}
	return p + ": " + v.Message
}

// InvalidError is returned by ValidateEvent and ValidateWorkflow when a
// document does not conform. Its message lists every violation.
type InvalidError struct {
	// What names the schema: "event" or "workflow".
	What       string
	Violations []Violation
	// Cause is the validator's full error tree.
	Cause *jsonschema.ValidationError
}

func (e *InvalidError) Error() string {
	parts := make([]string, len(e.Violations))
	for i, v := range e.Violations {
		parts[i] = v.String()
	}
	if len(parts) == 0 {
		return e.What + ": does not match its schema"
	}
	return "invalid " + e.What + ": " + strings.Join(parts, "; ")
}

func (e *InvalidError) Unwrap() error { return e.Cause }

// Violations flattens a validation error tree into its leaves, sorted by
// location (array indexes numerically) and then by message.
func Violations(err error) []Violation {
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return nil
	}
	var out []Violation
	collect(ve, &out)
	slices.SortStableFunc(out, func(a, b Violation) int {
		if c := comparePath(a.Path, b.Path); c != 0 {
			return c
		}
		return strings.Compare(a.Message, b.Message)
	})
	return slices.CompactFunc(out, func(a, b Violation) bool {
		return a.Message == b.Message && slices.Equal(a.Path, b.Path)
	})
}

func collect(ve *jsonschema.ValidationError, out *[]Violation) {
	if alt, ok := requiredAlternatives(ve); ok {
		*out = append(*out, alt)
		return
	}
	if len(ve.Causes) == 0 {
		*out = append(*out, leaf(ve))
		return
	}
	for _, c := range ve.Causes {
		collect(c, out)
	}
}

func leaf(ve *jsonschema.ValidationError) Violation {
	kw := ""
	if p := ve.ErrorKind.KeywordPath(); len(p) > 0 {
		kw = p[0]
	}
	return Violation{
		Path:      slices.Clone(ve.InstanceLocation),
		Keyword:   kw,
		SchemaURL: ve.SchemaURL,
		Kind:      ve.ErrorKind,
		Message:   ve.ErrorKind.LocalizedString(printer),
	}
}

// requiredAlternatives recognises an anyOf/oneOf whose branches each failed
// only because a property was missing at the same location, such as "prompt
// or messages", and folds it into one violation.
func requiredAlternatives(ve *jsonschema.ValidationError) (Violation, bool) {
	switch ve.ErrorKind.(type) {
	case *kind.AnyOf, *kind.OneOf:
	default:
		return Violation{}, false
	}
	if len(ve.Causes) < 2 {
		return Violation{}, false
	}
	var missing []string
	for _, c := range ve.Causes {
		for len(c.Causes) == 1 && !isRequired(c) {
			c = c.Causes[0]
		}
		r, ok := c.ErrorKind.(*kind.Required)
		if !ok || len(c.Causes) != 0 || !slices.Equal(c.InstanceLocation, ve.InstanceLocation) {
			return Violation{}, false
		}
		missing = append(missing, r.Missing...)
	}
	quoted := make([]string, len(missing))
	for i, m := range missing {
		quoted[i] = "'" + m + "'"
	}
	return Violation{
		Path:         slices.Clone(ve.InstanceLocation),
		Keyword:      "required",
		SchemaURL:    ve.SchemaURL,
		Kind:         &kind.Required{Missing: missing},
		Alternatives: true,
		Message:      "missing property " + strings.Join(quoted, " or "),
	}, true
}

func isRequired(ve *jsonschema.ValidationError) bool {
	_, ok := ve.ErrorKind.(*kind.Required)
	return ok
}

func comparePath(a, b []string) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] == b[i] {
			continue
		}
		ai, aerr := strconv.Atoi(a[i])
		bi, berr := strconv.Atoi(b[i])
		if aerr == nil && berr == nil {
			return ai - bi
		}
		return strings.Compare(a[i], b[i])
	}
	return len(a) - len(b)
}

func cutFragment(u string) (id, ptr string, ok bool) {
	id, frag, ok := strings.Cut(u, "#")
	if !ok {
		return id, "", false
	}
	if p, err := url.PathUnescape(frag); err == nil {
		frag = p
	}
	return id, frag, true
}

func resolvePointer(doc any, ptr string) (any, bool) {
	if ptr == "" {
		return doc, true
	}
	if !strings.HasPrefix(ptr, "/") {
		return nil, false
	}
	cur := doc
	for _, tok := range strings.Split(ptr[1:], "/") {
		tok = strings.NewReplacer("~1", "/", "~0", "~").Replace(tok)
		switch v := cur.(type) {
		case map[string]any:
			next, ok := v[tok]
			if !ok {
				return nil, false
			}
			cur = next
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(v) {
				return nil, false
			}
			cur = v[i]
		default:
			return nil, false
		}
	}
	return cur, true
}
