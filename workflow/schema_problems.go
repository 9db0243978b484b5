package workflow

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6/kind"

	"github.com/palrun/pal/schemas"
)

// implementedTypes are the node types the schema accepts, in the order error
// messages list them.
var implementedTypes = []string{TypeTrigger, TypeAIStep, TypeTool, TypeConnector, TypeCondition, TypeApproval, TypeLoop, TypeSubagent, TypeAgent, TypeProcess, TypeWait}

// plannedTypes are node types that exist in the design but are not
// implemented yet.
var plannedTypes = []string{}

// requiredHints explain, per schema definition, what an object needs.
var requiredHints = map[string]string{
	"":                     "a workflow needs name and nodes",
	"/$defs/node":          "a node needs id and type",
	"/$defs/edge":          "an edge needs from and to",
	"/$defs/message":       "a message needs role and content",
	"/$defs/aiStepData":    "an ai-step needs provider, model, and prompt or messages",
	"/$defs/toolData":      "a tool node needs tool: a tool registered on the worker, or \"http\", \"echo\" or \"sleep\"",
	"/$defs/connectorData": "a connector needs kind, and url (webhook) or from, to, subject and text or html (email)",
	"/$defs/conditionData": "a condition node needs expression",
	"/$defs/processData":   "a process node needs command: the program and its arguments",
	"/$defs/waitData":      "a wait node needs signal: the name of the signal it waits for",
}

// dataDefs maps a node type to its data definition.
var dataDefs = map[string]string{
	TypeTrigger:   "/$defs/triggerData",
	TypeAIStep:    "/$defs/aiStepData",
	TypeTool:      "/$defs/toolData",
	TypeConnector: "/$defs/connectorData",
	TypeCondition: "/$defs/conditionData",
	TypeWait:      "/$defs/waitData",
}

// location says where in the workflow a schema violation is.
type location struct {
	nodeID string
	nodeTy string // the node's type, when in a node
	edge   int
	label  string
	// base is how many path elements the node or edge takes ("nodes", "2");
	// the field is rendered from there, after prefix ("nodes[2]" for a node
	// without a usable id).
	base   int
	prefix string
	order  [2]int // sort key: section (0 workflow, 1 nodes, 2 edges), index
}

func locate(doc any, path []string) location {
	loc := location{edge: -1}
	if len(path) == 0 {
		return loc
	}
	switch path[0] {
	case "nodes":
		loc.order = [2]int{1, -1}
	case "edges":
		loc.order = [2]int{2, -1}
	default:
		return loc
	}
	if len(path) < 2 {
		return loc
	}
	top, _ := doc.(map[string]any)
	arr, _ := top[path[0]].([]any)
	i, err := strconv.Atoi(path[1])
	if err != nil || i < 0 || i >= len(arr) {
		return loc
	}
	obj, _ := arr[i].(map[string]any)
	loc.base = 2
	loc.order[1] = i
	if path[0] == "nodes" {
		loc.nodeTy, _ = obj["type"].(string)
		if id, ok := obj["id"].(string); ok && id != "" {
			loc.nodeID = id
		} else {
			loc.prefix = "nodes[" + path[1] + "]"
		}
		return loc
	}
	loc.edge = i
	from, _ := obj["from"].(string)
	to, _ := obj["to"].(string)
	if from != "" && to != "" {
		loc.label = edgeLabel(from, to)
	}
	return loc
}

// renderField renders path[base:] as "data.retry.retryableClasses[1]",
// after prefix, telling array indexes from object keys by walking doc.
func renderField(doc any, path []string, base int, prefix string) string {
	out := prefix
	cur := doc
	for i, p := range path {
		arr, isArr := cur.([]any)
		if i >= base {
			if isArr {
				out += "[" + p + "]"
			} else {
				out = joinField(out, p)
			}
		}
		switch {
		case isArr:
			n, err := strconv.Atoi(p)
			cur = nil
			if err == nil && n >= 0 && n < len(arr) {
				cur = arr[n]
			}
		default:
			m, _ := cur.(map[string]any)
			cur = m[p]
		}
	}
	return out
}

// defOf returns the definition part of a schema URL: "/$defs/aiStepData",
// "" for the root.
func defOf(schemaURL string) string {
	_, frag, _ := strings.Cut(schemaURL, "#")
	return frag
}

// schemaProblems turns schema violations into problems, workflow-level ones
// first, then by node, then by edge.
func schemaProblems(doc any, vs []schemas.Violation) problems {
	type keyed struct {
		order [2]int
		p     Problem
	}
	var out []keyed
	for _, v := range vs {
		loc := locate(doc, v.Path)
		// add reports msg about the violation's location, or about its
		// field named extra.
		add := func(extra, msg string) {
			path := v.Path
			if extra != "" {
				path = append(slices.Clone(v.Path), extra)
			}
			p := Problem{NodeID: loc.nodeID, Edge: loc.edge, edge: loc.label, Message: msg,
				Field: renderField(doc, path, loc.base, loc.prefix)}
			out = append(out, keyed{loc.order, p})
		}
		isTypeField := len(v.Path) == 3 && v.Path[0] == "nodes" && v.Path[2] == "type"

		switch k := v.Kind.(type) {
		case *kind.Required:
			hint := requiredHint(v.SchemaURL, loc.nodeTy)
			if v.Alternatives {
				add("", "needs "+strings.Join(k.Missing, " or "))
				continue
			}
			for _, m := range k.Missing {
				add(m, "missing required field"+hint)
			}
		case *kind.AdditionalProperties:
			allowed := allowedFields(v.SchemaURL)
			for _, p := range k.Properties {
				add(p, unknownField(p, allowed, defOf(v.SchemaURL)))
			}
		case *kind.Enum:
			if isTypeField && loc.nodeID != "" {
				// node "y": unknown type "z" (…)
				out = append(out, keyed{loc.order, Problem{NodeID: loc.nodeID, Edge: -1, Message: unknownType(k.Got)}})
				continue
			}
			if isTypeField {
				add("", unknownType(k.Got))
				continue
			}
			add("", fmt.Sprintf("unsupported value %s (want one of %s)", display(k.Got), displayList(k.Want)))
		case *kind.Const:
			add("", fmt.Sprintf("unsupported value %s (want %s)", display(k.Got), display(k.Want)))
		case *kind.Type:
			add("", typeMessage(k, len(v.Path) == 0))
		case *kind.Pattern:
			if len(v.Path) == 3 && v.Path[0] == "nodes" && v.Path[2] == "id" {
				add("", fmt.Sprintf("invalid id %q (use 1 to 64 letters, digits, '_' or '-')", k.Got))
				continue
			}
			add("", fmt.Sprintf("%q does not match %s", k.Got, k.Want))
		case *kind.MinLength:
			if k.Got == 0 {
				msg := "must not be empty"
				if last(v.Path) == "condition" {
					msg += " (omit it for an unconditional edge)"
				}
				add("", msg)
				continue
			}
			add("", fmt.Sprintf("must be at least %d characters long (got %d)", k.Want, k.Got))
		case *kind.MaxLength:
			add("", fmt.Sprintf("must be at most %d characters long (got %d)", k.Want, k.Got))
		case *kind.Minimum:
			add("", fmt.Sprintf("must be at least %s (got %s)", k.Want.RatString(), k.Got.RatString()))
		case *kind.Maximum:
			add("", fmt.Sprintf("must be at most %s (got %s)", k.Want.RatString(), k.Got.RatString()))
		case *kind.MinItems:
			if len(v.Path) == 1 && v.Path[0] == "nodes" {
				add("", "must not be empty (a workflow needs at least a trigger node)")
				continue
			}
			add("", fmt.Sprintf("must have at least %d item%s (got %d)", k.Want, plural(k.Want), k.Got))
		case *kind.MaxItems:
			add("", fmt.Sprintf("must have at most %d item%s (got %d)", k.Want, plural(k.Want), k.Got))
		default:
			add("", v.Message)
		}
	}
	slices.SortStableFunc(out, func(a, b keyed) int {
		if a.order[0] != b.order[0] {
			return a.order[0] - b.order[0]
		}
		return a.order[1] - b.order[1]
	})
	ps := make(problems, len(out))
	for i, k := range out {
		ps[i] = k.p
	}
	return ps
}

func last(field []string) string {
	if len(field) == 0 {
		return ""
	}
	return field[len(field)-1]
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func requiredHint(schemaURL, nodeType string) string {
	def := defOf(schemaURL)
	if strings.HasPrefix(def, "/$defs/node/allOf/") {
		// "data" required by a node type's rule: explain that type's data.
		def = dataDefs[nodeType]
	}
	if h, ok := requiredHints[def]; ok {
		return " (" + h + ")"
	}
	return ""
}

func allowedFields(schemaURL string) []string {
	def, ok := schemas.Lookup(schemaURL)
	if !ok {
		return nil
	}
	obj, _ := def.(map[string]any)
	props, _ := obj["properties"].(map[string]any)
	return slices.Sorted(maps.Keys(props))
}

func unknownField(name string, allowed []string, def string) string {
	if def == "/$defs/triggerData" {
		return "unknown field (a trigger has no settings)"
	}
	if s := suggest(name, allowed); s != "" {
		return "unknown field" + s
	}
	if len(allowed) == 0 {
		return "unknown field"
	}
	return "unknown field (want one of " + strings.Join(allowed, ", ") + ")"
}

func unknownType(got any) string {
	want := strings.Join(implementedTypes, ", ")
	s, ok := got.(string)
	if ok && slices.Contains(plannedTypes, s) {
		return fmt.Sprintf("type %q is not implemented yet (want one of %s)", s, want)
	}
	return fmt.Sprintf("unknown type %s (want one of %s)", display(got), want)
}

func typeMessage(k *kind.Type, root bool) string {
	want := make([]string, len(k.Want))
	for i, w := range k.Want {
		want[i] = article(w)
	}
	if root {
		return fmt.Sprintf("must be a JSON object (got %s)", article(k.Got))
	}
	return fmt.Sprintf("must be %s (got %s)", strings.Join(want, " or "), article(k.Got))
}

func article(t string) string {
	switch t {
	case "null":
		return "null"
	case "integer", "object", "array":
		return "an " + t
	}
	return "a " + t
}

// display renders a JSON value from the document for a message.
func display(v any) string {
	switch x := v.(type) {
	case string:
		return strconv.Quote(x)
	case json.Number:
		return x.String()
	case nil:
		return "null"
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	if len(b) > 40 {
		return string(b[:37]) + "..."
	}
	return string(b)
}

func displayList(vs []any) string {
	parts := make([]string, len(vs))
	for i, v := range vs {
		if s, ok := v.(string); ok {
			parts[i] = s
		} else {
			parts[i] = display(v)
		}
	}
	return strings.Join(parts, ", ")
}
