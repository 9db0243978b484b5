package workflow

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ErrInvalid is matched by every error Parse returns for a bad workflow:
// errors.Is(err, ErrInvalid). Use errors.As with *ValidationError for the
// details.
var ErrInvalid = errors.New("invalid workflow")

// Problem is one thing wrong with a workflow.
type Problem struct {
	// NodeID names the node the problem is in, "" if none (or if the node
	// has no usable id; Field then starts with "nodes[i]").
	NodeID string
	// Edge is the index of the edge the problem is in, -1 if none.
	Edge int
	// Field is the path of the offending field inside the node, the edge or
	// the workflow, e.g. "data.model", "condition", "name"; "" if the
	// problem is about the whole thing.
	Field string
	// Message says what is wrong and, where it helps, what to do.
	Message string

	// edge labels the edge as "from→to" when both ends are known.
	edge string
}

// String renders the problem as it appears in ValidationError's message:
//
//	node "draft": data.model: missing required field (…)
//	edge draft→review: condition: unknown name inptu (column 1) (…)
func (p Problem) String() string {
	var b strings.Builder
	switch {
	case p.NodeID != "":
		b.WriteString("node ")
		b.WriteString(strconv.Quote(p.NodeID))
		b.WriteString(": ")
	case p.Edge >= 0 && p.edge != "":
		b.WriteString("edge ")
		b.WriteString(p.edge)
		b.WriteString(": ")
	case p.Edge >= 0:
		b.WriteString("edges[")
		b.WriteString(strconv.Itoa(p.Edge))
		b.WriteString("]: ")
	}
	if p.Field != "" {
		b.WriteString(p.Field)
		b.WriteString(": ")
	}
	b.WriteString(p.Message)
	return b.String()
}

// ValidationError is the error Parse returns for a workflow that is not
// valid. It lists every problem found, not just the first.
type ValidationError struct {
	// Workflow is the workflow's name ("" when it has none).
	Workflow string
	Problems []Problem

	// unnamed is set when the document has no name to show: it is not JSON,
	// not an object, or its name is missing or not a string.
	unnamed bool
}

// Error reads like
//
//	workflow "summarise": node "draft": data.model: missing required field (…)
//
// with several problems joined by "; ". A document without a usable name
// reads `workflow: …`.
func (e *ValidationError) Error() string {
	var b strings.Builder
	b.WriteString("workflow")
	if !e.unnamed {
		b.WriteByte(' ')
		b.WriteString(strconv.Quote(e.Workflow))
	}
	b.WriteString(": ")
	if len(e.Problems) == 0 {
		b.WriteString("invalid")
	}
	for i, p := range e.Problems {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(p.String())
	}
	return b.String()
}

// Is makes errors.Is(err, ErrInvalid) true.
func (e *ValidationError) Is(target error) bool { return target == ErrInvalid }

func edgeLabel(from, to string) string { return from + "→" + to }

// problems collects the problems of one Parse.
type problems []Problem

func (ps *problems) workflow(field, format string, args ...any) {
	*ps = append(*ps, Problem{Edge: -1, Field: field, Message: fmt.Sprintf(format, args...)})
}

func (ps *problems) node(id, field, format string, args ...any) {
	*ps = append(*ps, Problem{NodeID: id, Edge: -1, Field: field, Message: fmt.Sprintf(format, args...)})
}

func (ps *problems) edge(i int, e Edge, field, format string, args ...any) {
	*ps = append(*ps, Problem{Edge: i, edge: edgeLabel(e.From, e.To), Field: field, Message: fmt.Sprintf(format, args...)})
}

// suggest returns ` (did you mean "x"?)` when one of candidates is close to
// s, else "".
func suggest(s string, candidates []string) string {
	best, bestD := "", 3 // at most 2 edits away
	for _, c := range candidates {
		if d := distance(strings.ToLower(s), strings.ToLower(c)); d < bestD && d < len(s) {
			best, bestD = c, d
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

// distance is the Levenshtein distance between a and b, in bytes.
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
