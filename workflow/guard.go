package workflow

import (
	"context"
	"fmt"
	"reflect"
	"regexp"
	"regexp/syntax"
	"strings"
	"time"

	"github.com/expr-lang/expr"
	"github.com/expr-lang/expr/ast"
	"github.com/expr-lang/expr/builtin"
	"github.com/expr-lang/expr/vm/runtime"
)

// An expression is compiled twice: once as written, to type-check it with
// errors that name what the author wrote, and once through guard, which
// rewrites the tree so that every loop iteration and every allocating
// builtin reports to the evaluation's evalState. expr's VM cannot be
// interrupted from outside, so the checks have to be inside the program:
// the state travels in the environment ($env) and the guarded functions
// return an error, which stops the VM, when a budget is spent.

// evalState is the budget of one evaluation.
type evalState struct {
	done     <-chan struct{}
	ctx      context.Context
	deadline time.Time
	ops      int
	bytes    int
	regexps  map[string]compiledRegexp
}

func newEvalState(ctx context.Context) *evalState {
	deadline := time.Now().Add(EvalTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	return &evalState{done: ctx.Done(), ctx: ctx, deadline: deadline}
}

// spend charges n operations and checks the clock and the context.
func (s *evalState) spend(n int) error {
	s.ops += n
	if s.ops > MaxEvalOps {
		return fmt.Errorf("%w: more than %d operations", ErrEvalLimit, MaxEvalOps)
	}
	select {
	case <-s.done:
		return fmt.Errorf("evaluation stopped: %w", context.Cause(s.ctx))
	default:
	}
	if time.Now().After(s.deadline) {
		return fmt.Errorf("%w: took longer than %v", ErrEvalLimit, EvalTimeout)
	}
	return nil
}

// alloc charges n bytes, about to be (or just) allocated, and the
// operations making them takes.
func (s *evalState) alloc(n int) error {
	if n > MaxEvalBytes-s.bytes {
		return fmt.Errorf("%w: more than %d bytes allocated", ErrEvalLimit, MaxEvalBytes)
	}
	s.bytes += n
	return s.spend(1 + n/1024)
}

// Names the guard gives the functions it calls. They start with "__" so
// that they cannot clash with a name an author would choose; calling one
// by hand only spends budget.
const (
	fnTick    = "__tick"
	fnMatches = "__matches"
	fnAdd     = "__add"
	guardPre  = "__"
)

// guardedBuiltins are the builtins that allocate in proportion to their
// arguments (or, for uniq, work in proportion to their square). Each call
// is rewritten to guardPre+name($env, args…).
var guardedBuiltins = []string{
	"repeat", "join", "replace", "toJSON", "string", "upper", "lower", "split", "splitAfter",
	"toBase64", "fromBase64", "fromJSON", "concat", "flatten", "uniq", "sort", "reverse",
	"fromPairs", "median", "keys", "values", "toPairs",
}

// guard is the ast.Visitor that puts the checks into a tree.
type guard struct{}

func envNode() ast.Node { return &ast.IdentifierNode{Value: "$env"} }

func callNode(at ast.Node, name string, args ...ast.Node) *ast.CallNode {
	c := &ast.CallNode{Callee: &ast.IdentifierNode{Value: name}, Arguments: args}
	c.SetLocation(at.Location())
	c.Callee.SetLocation(at.Location())
	return c
}

func isNumber(t reflect.Type) bool {
	if t == nil {
		return false
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64,
		reflect.Float32, reflect.Float64:
		return true
	}
	return false
}

// Visit implements ast.Visitor. Walk visits children first, so the nodes
// made here are not visited again.
func (guard) Visit(node *ast.Node) {
	switch n := (*node).(type) {
	case *ast.PredicateNode:
		seq := &ast.SequenceNode{Nodes: []ast.Node{callNode(n, fnTick, envNode()), n.Node}}
		seq.SetLocation(n.Location())
		n.Node = seq
	case *ast.BinaryNode:
		switch n.Operator {
		case "matches":
			ast.Patch(node, callNode(n, fnMatches, envNode(), n.Left, n.Right))
		case "+":
			if !isNumber(n.Left.Type()) || !isNumber(n.Right.Type()) {
				ast.Patch(node, callNode(n, fnAdd, envNode(), n.Left, n.Right))
			}
		}
	case *ast.BuiltinNode:
		if isGuarded(n.Name) {
			ast.Patch(node, callNode(n, guardPre+n.Name, append([]ast.Node{envNode()}, n.Arguments...)...))
		}
	case *ast.CallNode:
		// keys, values and toPairs are PAL's own functions, so calls to
		// them are CallNodes.
		if id, ok := n.Callee.(*ast.IdentifierNode); ok && isGuarded(id.Value) && !strings.HasPrefix(id.Value, guardPre) {
			ast.Patch(node, callNode(n, guardPre+id.Value, append([]ast.Node{envNode()}, n.Arguments...)...))
		}
	}
}

func isGuarded(name string) bool {
	for _, g := range guardedBuiltins {
		if g == name {
			return true
		}
	}
	return false
}

func stateOf(v any) *evalState {
	if e, ok := v.(*exprEnv); ok && e.state != nil {
		return e.state
	}
	// Only an evaluation run by condition.run has a state; give anything
	// else (a constant folded at compile time) a fresh budget.
	return newEvalState(context.Background())
}

// guardOptions registers the guarded functions and the visitor.
func guardOptions() []expr.Option {
	opts := []expr.Option{
		expr.Patch(guard{}),
		expr.Function(fnTick, func(p ...any) (any, error) {
			return nil, stateOf(p[0]).spend(1)
		}),
		expr.Function(fnMatches, guardedMatches),
		expr.Function(fnAdd, guardedAdd),
	}
	for _, name := range guardedBuiltins {
		var impl func(args ...any) (any, error)
		switch name {
		case "keys":
			impl = sortedKeys
		case "values":
			impl = sortedValues
		case "toPairs":
			impl = sortedPairs
		default:
			impl = builtinFunc(builtin.Builtins[builtin.Index[name]])
		}
		opts = append(opts, expr.Function(guardPre+name, guarded(name, impl)))
	}
	return opts
}

// builtinFunc calls an expr builtin the way the VM would.
func builtinFunc(f *builtin.Function) func(args ...any) (any, error) {
	return func(args ...any) (any, error) {
		switch {
		case f.Fast != nil:
			if len(args) != 1 {
				return nil, fmt.Errorf("%s takes 1 argument, got %d", f.Name, len(args))
			}
			return f.Fast(args[0]), nil
		case f.Safe != nil:
			out, _, err := f.Safe(args...)
			return out, err
		default:
			return f.Func(args...)
		}
	}
}

// guarded wraps a builtin: it refuses a call whose result would go past
// the budget before making it, then charges what the call made.
func guarded(name string, impl func(args ...any) (any, error)) func(p ...any) (any, error) {
	return func(p ...any) (any, error) {
		st := stateOf(p[0])
		args := p[1:]
		pre := precost(name, args)
		if err := st.alloc(pre); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		out, err := impl(args...)
		if err != nil {
			return nil, err
		}
		if err := st.alloc(max(0, allocSize(out)-pre)); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		return out, nil
	}
}

// precost estimates, without allocating, the bytes a call will make when
// that can exceed what its arguments hold. It only has to be an upper
// bound for the calls whose result can be far larger than their input.
func precost(name string, args []any) int {
	str := func(i int) (string, bool) {
		if i >= len(args) {
			return "", false
		}
		s, ok := args[i].(string)
		return s, ok
	}
	switch name {
	case "repeat":
		s, ok := str(0)
		if !ok || len(args) != 2 {
			return 0
		}
		n, ok := args[1].(int)
		if !ok || n < 0 {
			return 0
		}
		return mulSat(len(s), n)
	case "replace":
		s, ok1 := str(0)
		old, ok2 := str(1)
		repl, ok3 := str(2)
		if !ok1 || !ok2 || !ok3 || len(repl) <= len(old) {
			return 0
		}
		count := strings.Count(s, old)
		return len(s) + mulSat(count, len(repl)-len(old))
	case "join":
		if len(args) == 0 {
			return 0
		}
		glue, _ := str(1)
		total := 0
		switch a := args[0].(type) {
		case []any:
			for _, e := range a {
				if s, ok := e.(string); ok {
					total += len(s) + len(glue)
				}
				if total > MaxEvalBytes {
					break
				}
			}
		case []string:
			for _, s := range a {
				total += len(s) + len(glue)
				if total > MaxEvalBytes {
					break
				}
			}
		}
		return total
	case "toJSON", "string":
		if len(args) != 1 {
			return 0
		}
		return jsonSize(args[0], MaxEvalBytes, name == "toJSON")
	case "concat":
		total := 0
		for _, a := range args {
			if v := reflect.ValueOf(a); v.Kind() == reflect.Slice || v.Kind() == reflect.Array {
				total += 16 * v.Len()
			}
		}
		return total
	case "flatten":
		if len(args) != 1 {
			return 0
		}
		return 16 * countLeaves(reflect.ValueOf(args[0]), MaxEvalBytes/16+1, 0)
	case "uniq":
		// uniq compares each item with those kept: charge the square as
		// operations, by way of bytes.
		if len(args) == 1 {
			if v := reflect.ValueOf(args[0]); v.Kind() == reflect.Slice {
				return mulSat(v.Len(), v.Len()) / 64
			}
		}
	}
	return 0
}

// countLeaves counts the non-array items flatten would produce, stopping
// past limit.
func countLeaves(v reflect.Value, limit, n int) int {
	for v.Kind() == reflect.Interface && !v.IsNil() {
		v = v.Elem()
	}
	if v.Kind() != reflect.Slice && v.Kind() != reflect.Array {
		return n + 1
	}
	for i := 0; i < v.Len() && n <= limit; i++ {
		n = countLeaves(v.Index(i), limit, n)
	}
	return n
}

// allocSize is what a builtin's result took to make, shallowly: the values
// inside an array may be shared with the arguments.
func allocSize(v any) int {
	switch x := v.(type) {
	case string:
		return len(x)
	case nil, bool, int, float64:
		return 0
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Slice, reflect.Array:
		return 16 * rv.Len()
	case reflect.Map:
		return 64 * rv.Len()
	}
	return 0
}

// regexpCost is the divisor of len(text)×(instructions of the compiled
// pattern) that gives the operations one match is charged. Go's regexp
// runs in time linear in both (about a microsecond per operation so
// charged), so no single match can run past what the budget allows: it
// is refused before it starts.
const regexpCost = 64

// maxMatchOps bounds the cost of one match: about 50 ms.
const maxMatchOps = MaxEvalOps / 4

// compiledRegexp is a pattern compiled once per evaluation, with its
// program's size.
type compiledRegexp struct {
	re    *regexp.Regexp
	insts int
}

func guardedMatches(p ...any) (any, error) {
	st := stateOf(p[0])
	a, b := p[1], p[2]
	if runtime.IsNil(a) || runtime.IsNil(b) {
		return false, nil
	}
	pattern, ok := b.(string)
	if !ok {
		return nil, fmt.Errorf("matches: the pattern is %s, not a string", describe(b))
	}
	s, ok := a.(string)
	if !ok {
		return nil, fmt.Errorf("matches: the text is %s, not a string", describe(a))
	}
	re, ok := st.regexps[pattern]
	if !ok {
		// Compiling costs about its length; a pattern may come from the
		// input.
		if err := st.spend(1 + len(pattern)/16); err != nil {
			return nil, fmt.Errorf("matches: %w", err)
		}
		var err error
		if re, err = compileRegexp(pattern); err != nil {
			return nil, err
		}
		if st.regexps == nil {
			st.regexps = map[string]compiledRegexp{}
		}
		st.regexps[pattern] = re
	}
	cost := 1 + mulSat(len(s), re.insts)/regexpCost
	if cost > maxMatchOps {
		// A match cannot be interrupted: bound each one, so that a
		// deadline or a cancel is seen soon.
		return nil, fmt.Errorf("matches: %w: matching %d bytes against a pattern of %d instructions costs %d operations, more than the %d one match may",
			ErrEvalLimit, len(s), re.insts, cost, maxMatchOps)
	}
	if err := st.spend(cost); err != nil {
		return nil, fmt.Errorf("matches: %w", err)
	}
	return re.re.MatchString(s), nil
}

func compileRegexp(pattern string) (compiledRegexp, error) {
	re, err := regexp.Compile(pattern)
	if err != nil {
		return compiledRegexp{}, err
	}
	// The size of the program regexp runs, which a short pattern with
	// counted repetitions ([a-z]{1000}) makes large.
	tree, err := syntax.Parse(pattern, syntax.Perl)
	if err != nil {
		return compiledRegexp{}, err
	}
	prog, err := syntax.Compile(tree.Simplify())
	if err != nil {
		return compiledRegexp{}, err
	}
	return compiledRegexp{re: re, insts: len(prog.Inst)}, nil
}

func guardedAdd(p ...any) (any, error) {
	st := stateOf(p[0])
	a, b := p[1], p[2]
	if x, ok := a.(string); ok {
		if y, ok := b.(string); ok {
			if err := st.alloc(len(x) + len(y)); err != nil {
				return nil, fmt.Errorf("+: %w", err)
			}
			return x + y, nil
		}
	}
	if err := st.spend(1); err != nil {
		return nil, err
	}
	return runtime.Add(a, b), nil
}
