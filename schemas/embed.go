// Package schemas holds PAL's JSON Schemas (draft 2020-12), embedded in the
// binary, and validators compiled from them once per process.
//
//   - event.schema.json describes a message on pal.events.<run_id>: one event
//     envelope, or an array of consecutive envelopes of one run (the packed
//     form of strict durability mode). Every event PAL writes validates
//     against it. New event kinds are added here first.
//   - workflow.schema.json describes a workflow graph. It checks the shape
//     (fields, types, node types and their data); package workflow adds the
//     graph checks (one trigger, no cycles, references) on top.
//
// The schemas are public interface: clients may validate against the raw
// bytes (EventSchema, WorkflowSchema) with any draft 2020-12 validator.
//
// Invariant: the schema changes first. A new event kind or field, or a new
// node type, is added here before any code writes it, so every journal
// message and every workflow PAL accepts validates against the schema of
// its own version (docs/architecture.md §6).
package schemas

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// Raw schema documents.
var (
	//go:embed event.schema.json
	EventSchema []byte

	//go:embed workflow.schema.json
	WorkflowSchema []byte
)

// Schema identifiers ($id of each document).
const (
	EventSchemaID    = "https://github.com/palrun/pal/schemas/event.schema.json"
	WorkflowSchemaID = "https://github.com/palrun/pal/schemas/workflow.schema.json"
)

type compiled struct {
	event    *jsonschema.Schema
	workflow *jsonschema.Schema
	// docs maps a schema id to its decoded document, for Lookup.
	docs map[string]any
	err  error
}

var (
	once  sync.Once
	cache compiled
)

func load() *compiled {
	once.Do(func() { cache = compile() })
	return &cache
}

func compile() compiled {
	out := compiled{docs: map[string]any{}}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	for _, s := range []struct {
		id  string
		raw []byte
	}{{EventSchemaID, EventSchema}, {WorkflowSchemaID, WorkflowSchema}} {
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(s.raw))
		if err != nil {
			out.err = fmt.Errorf("decoding schema %s: %w", s.id, err)
			return out
		}
		if err := c.AddResource(s.id, doc); err != nil {
			out.err = fmt.Errorf("adding schema %s: %w", s.id, err)
			return out
		}
		out.docs[s.id] = doc
	}
	var err error
	if out.event, err = c.Compile(EventSchemaID); err != nil {
		out.err = fmt.Errorf("compiling schema %s: %w", EventSchemaID, err)
		return out
	}
	if out.workflow, err = c.Compile(WorkflowSchemaID); err != nil {
		out.err = fmt.Errorf("compiling schema %s: %w", WorkflowSchemaID, err)
		return out
	}
	return out
}

// Event returns the compiled event schema. The error is non-nil only if the
// embedded schema is broken (a build defect, caught by the package tests).
func Event() (*jsonschema.Schema, error) {
	c := load()
	return c.event, c.err
}

// Workflow returns the compiled workflow schema. The error is non-nil only if
// the embedded schema is broken.
func Workflow() (*jsonschema.Schema, error) {
	c := load()
	return c.workflow, c.err
}

// ErrInvalidJSON is wrapped by ValidateEvent when body is not JSON.
var ErrInvalidJSON = errors.New("invalid JSON")

// ValidateEvent checks a message body (one envelope or an array of them)
// against event.schema.json. It returns an error wrapping ErrInvalidJSON if
// body is not JSON, an *InvalidError listing the violations if it does not
// conform, or the error from Event if the schema itself is broken.
func ValidateEvent(body []byte) error {
	sch, err := Event()
	if err != nil {
		return err
	}
	doc, err := decodeJSON(body)
	if err != nil {
		return fmt.Errorf("event: %w: %v", ErrInvalidJSON, err)
	}
	return check("event", sch, doc)
}

// ValidateWorkflow checks a decoded workflow document against
// workflow.schema.json. doc is a value as decoded by encoding/json with
// UseNumber (map[string]any, []any, json.Number, string, bool, nil). It
// returns an *InvalidError listing the violations if doc does not conform.
// Package workflow's Parse calls it and adds the graph checks; use Parse to
// validate a workflow fully.
func ValidateWorkflow(doc any) error {
	sch, err := Workflow()
	if err != nil {
		return err
	}
	return check("workflow", sch, doc)
}

func decodeJSON(body []byte) (any, error) {
	r := bytes.NewReader(body)
	doc, err := jsonschema.UnmarshalJSON(r)
	if err != nil {
		return nil, err
	}
	return doc, nil
}

func check(what string, sch *jsonschema.Schema, doc any) error {
	err := sch.Validate(doc)
	if err == nil {
		return nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return fmt.Errorf("%s: %w", what, err)
	}
	return &InvalidError{What: what, Violations: Violations(ve), Cause: ve}
}

// Lookup returns the part of an embedded schema document that a schema URL
// names, e.g. ".../workflow.schema.json#/$defs/aiStepData", as decoded JSON
// (map[string]any for a schema object). It reports false for an unknown
// document or pointer.
func Lookup(schemaURL string) (any, bool) {
	c := load()
	if c.err != nil {
		return nil, false
	}
	id, ptr, _ := cutFragment(schemaURL)
	doc, ok := c.docs[id]
	if !ok {
		return nil, false
	}
	return resolvePointer(doc, ptr)
}
