package schemas

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// Bounds on a schema a workflow gives for a model's answer (an ai-step's or
// agent's responseSchema). A workflow comes from whoever may start a run, so
// what compiling its schema may cost is bounded before the compiler sees it.
const (
	// MaxAnswerSchemaBytes bounds the schema's JSON.
	MaxAnswerSchemaBytes = 64 << 10
	// MaxAnswerSchemaDepth bounds its nesting: objects and arrays.
	MaxAnswerSchemaDepth = 32
)

// answerSchemaURL is the location a responseSchema compiles under: it names
// no file and no host, and nothing is loaded from it.
const answerSchemaURL = "urn:pal:responseSchema"

// ErrAnswerSchema is wrapped by CompileAnswer for a schema it refuses.
var ErrAnswerSchema = errors.New("invalid responseSchema")

// AnswerSchema is a compiled responseSchema: the JSON Schema (draft
// 2020-12 unless it says otherwise) a model's answer must match.
type AnswerSchema struct{ s *jsonschema.Schema }

// refuseLoader loads nothing: a responseSchema may refer only to itself
// ("#/$defs/…") and to the meta-schemas the validator embeds, never to a
// file or a URL (the validator's default loader would read local files).
type refuseLoader struct{}

func (refuseLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("%q: a responseSchema may not refer to other documents", url)
}

// CompileAnswer compiles raw, a workflow's responseSchema. It returns an
// error wrapping ErrAnswerSchema for a schema over MaxAnswerSchemaBytes or
// nested deeper than MaxAnswerSchemaDepth, one that is not a JSON object,
// refers to another document, or does not compile.
func CompileAnswer(raw json.RawMessage) (*AnswerSchema, error) {
	if len(raw) > MaxAnswerSchemaBytes {
		return nil, fmt.Errorf("%w: %d bytes, over the limit of %d", ErrAnswerSchema, len(raw), MaxAnswerSchemaBytes)
	}
	if err := checkDepth(raw, MaxAnswerSchemaDepth); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrAnswerSchema, err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("%w: not JSON: %v", ErrAnswerSchema, err)
	}
	if _, ok := doc.(map[string]any); !ok {
		return nil, fmt.Errorf("%w: want a JSON Schema object", ErrAnswerSchema)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.UseLoader(refuseLoader{})
	if err := c.AddResource(answerSchemaURL, doc); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrAnswerSchema, err)
	}
	s, err := c.Compile(answerSchemaURL)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrAnswerSchema, err)
	}
	return &AnswerSchema{s: s}, nil
}

// Validate parses answer as JSON and checks it against the schema. It
// returns the answer's JSON (compacted), or an error saying why it is not
// JSON, or an *InvalidError (What "answer") listing the violations.
func (a *AnswerSchema) Validate(answer []byte) (json.RawMessage, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(answer))
	if err != nil {
		return nil, fmt.Errorf("the answer is not JSON: %v", err)
	}
	if err := check("answer", a.s, doc); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, answer); err != nil {
		return nil, fmt.Errorf("the answer is not JSON: %v", err)
	}
	return buf.Bytes(), nil
}

// checkDepth reports an error when raw nests objects and arrays deeper than
// max, reading tokens only (nothing is built).
func checkDepth(raw []byte, max int) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	depth := 0
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("not JSON: %v", err)
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			if depth++; depth > max {
				return fmt.Errorf("nested more than %d deep", max)
			}
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
	}
}
