package workflow

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"time"

	"github.com/expr-lang/expr/ast"
	"github.com/expr-lang/expr/file"
	"github.com/expr-lang/expr/parser/lexer"
)

// Bounds on what a workflow's expressions and templates may cost. A
// workflow comes from whoever may start a run, so parsing and evaluating it
// must not be able to exhaust the stack, the heap or a worker's CPU. The
// package doc lists them with what happens at each.
const (
	// MaxExpressionBytes caps the source of one expression (edge condition,
	// condition node, loop until).
	MaxExpressionBytes = 4 << 10
	// MaxExpressionDepth caps how deeply (), [] and {} nest in an
	// expression. Both limits are checked before expr's recursive parser
	// sees the source.
	MaxExpressionDepth = 64

	// MaxEvalItems is the expr VM's memory budget: the items of the
	// arrays, maps and ranges one evaluation creates.
	MaxEvalItems = 1_000_000
	// MaxEvalBytes caps what the builtins of one evaluation allocate:
	// string bytes, 16 bytes per array item, 64 per map entry. A constant
	// argument that would go past it (repeat("a", 1e12), 1..1e9) is
	// refused when the workflow is parsed.
	MaxEvalBytes = 16 << 20
	// MaxEvalOps caps the work of one evaluation: one operation per
	// iteration of a predicate (any, all, map, filter, reduce, …), one per
	// KiB a builtin makes, and len(text)×(pattern program size)/64 for a
	// match, of which one may cost at most a quarter of the budget.
	MaxEvalOps = 200_000
	// EvalTimeout caps the time of one evaluation, whatever the caller's
	// context allows.
	EvalTimeout = 500 * time.Millisecond
	// MaxResultBytes caps the JSON size of a condition node's result (or
	// an Eval result): it becomes a step output in the journal.
	MaxResultBytes = 1 << 20

	// MaxTemplateBytes caps one template string (a prompt, a url, a string
	// in a tool input or connector body).
	MaxTemplateBytes = 256 << 10
	// MaxTemplatePlaceholders caps the {{…}} in one template.
	MaxTemplatePlaceholders = 1000
	// MaxTemplateDepth caps how deeply a JSON value holding templates (tool
	// input, connector body, subagent input, loop with) nests.
	MaxTemplateDepth = 64
	// MaxRenderBytes caps what one RenderString or RenderJSON produces: a
	// step input larger than an event cannot be journaled anyway.
	MaxRenderBytes = 1 << 20

	// MaxWorkflowNesting caps how deeply loop bodies and subagent
	// workflows nest inside one document.
	MaxWorkflowNesting = 8
)

// ErrEvalLimit is matched (errors.Is) by the error of an evaluation that
// was stopped because it went past a bound: MaxEvalItems, MaxEvalBytes,
// MaxEvalOps, EvalTimeout or MaxResultBytes. Such a step should fail, not
// be retried: the same expression over the same values fails the same way
// (the time limit aside).
var ErrEvalLimit = errors.New("evaluation limit exceeded")

// checkExprShape refuses an expression too long or too deeply nested for
// the parser, before the parser sees it. The lexer is iterative, so it is
// safe on any input; tokens (not bytes) are counted so that brackets in
// strings and comments do not count.
func checkExprShape(src string) *ExprError {
	if len(src) > MaxExpressionBytes {
		return &ExprError{Expression: clip(src),
			Message: fmt.Sprintf("expression is %d bytes, longer than the %d allowed", len(src), MaxExpressionBytes)}
	}
	tokens, err := lexer.Lex(file.NewSource(src))
	if err != nil {
		return nil // the parser reports it, with its position
	}
	depth := 0
	for _, t := range tokens {
		if t.Kind != lexer.Bracket {
			continue
		}
		switch t.Value {
		case "(", "[", "{":
			if depth++; depth > MaxExpressionDepth {
				fe := &file.Error{Location: t.Location,
					Message: fmt.Sprintf("brackets nested deeper than %d levels", MaxExpressionDepth)}
				return exprError(src, fe.Bind(file.NewSource(src)))
			}
		default:
			depth--
		}
	}
	return nil
}

// clip shortens s for an error message.
func clip(s string) string {
	if len(s) > 80 {
		return s[:77] + "..."
	}
	return s
}

// staticLimits finds, in a parsed expression, constant arguments that
// would go past the evaluation budget whatever the input: a range of more
// than MaxEvalItems, a repeat or concatenation of constants longer than
// MaxEvalBytes.
type staticLimits struct {
	err *file.Error
	// lens holds the length of string nodes whose value is known.
	lens map[ast.Node]int
}

func checkStaticLimits(node ast.Node) *file.Error {
	v := &staticLimits{lens: map[ast.Node]int{}}
	ast.Walk(&node, v)
	return v.err
}

func (v *staticLimits) fail(n ast.Node, format string, args ...any) {
	if v.err == nil {
		v.err = &file.Error{Location: n.Location(), Message: fmt.Sprintf(format, args...)}
	}
}

// Visit implements ast.Visitor; children come before their parent, so the
// lengths of arguments are known when a call is seen.
func (v *staticLimits) Visit(node *ast.Node) {
	switch n := (*node).(type) {
	case *ast.StringNode:
		v.lens[n] = len(n.Value)
	case *ast.BinaryNode:
		switch n.Operator {
		case "..":
			from, ok1 := n.Left.(*ast.IntegerNode)
			to, ok2 := n.Right.(*ast.IntegerNode)
			if ok1 && ok2 && int64(to.Value)-int64(from.Value)+1 >= MaxEvalItems {
				v.fail(n, "range %d..%d has more items than the %d an expression may create", from.Value, to.Value, MaxEvalItems)
			}
		case "+":
			l, ok1 := v.lens[n.Left]
			r, ok2 := v.lens[n.Right]
			if ok1 && ok2 {
				v.lens[n] = l + r
			}
		}
	case *ast.BuiltinNode:
		if n.Name != "repeat" || len(n.Arguments) != 2 {
			return
		}
		l, ok1 := v.lens[n.Arguments[0]]
		count, ok2 := n.Arguments[1].(*ast.IntegerNode)
		if !ok1 || !ok2 || count.Value < 0 {
			return
		}
		size := mulSat(l, count.Value)
		if size > MaxEvalBytes {
			v.fail(n, "repeat would make a string of %d bytes, more than the %d an expression may allocate", size, MaxEvalBytes)
			return
		}
		v.lens[n] = size
	}
}

// mulSat multiplies non-negative a and b, saturating at MaxInt.
func mulSat(a, b int) int {
	if a != 0 && b > math.MaxInt/a {
		return math.MaxInt
	}
	return a * b
}

// jsonSize returns about how many bytes v takes as JSON (indented with two
// spaces when indent is set), stopping as soon as it passes limit: it never
// walks more than limit bytes' worth, even when an array holds the same
// big value many times.
func jsonSize(v any, limit int, indent bool) int {
	n := 0
	var walk func(v reflect.Value, depth int)
	walk = func(v reflect.Value, depth int) {
		if n > limit {
			return
		}
		pad := 0
		if indent {
			pad = 2*depth + 1
		}
		switch v.Kind() {
		case reflect.Interface, reflect.Pointer:
			if v.IsNil() {
				n += 4
				return
			}
			walk(v.Elem(), depth)
		case reflect.String:
			n += len(v.String()) + 2
		case reflect.Slice, reflect.Array:
			n += 2
			for i := 0; i < v.Len() && n <= limit; i++ {
				n += 1 + pad
				walk(v.Index(i), depth+1)
			}
		case reflect.Map:
			n += 2
			it := v.MapRange()
			for it.Next() && n <= limit {
				n += 2 + pad
				walk(it.Key(), depth+1)
				walk(it.Value(), depth+1)
			}
		case reflect.Invalid:
			n += 4
		default:
			n += 8
		}
	}
	walk(reflect.ValueOf(v), 0)
	return n
}
