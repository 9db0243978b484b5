package workflow

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/expr-lang/expr"
	"github.com/expr-lang/expr/ast"
	"github.com/expr-lang/expr/file"
	"github.com/expr-lang/expr/parser"
	"github.com/expr-lang/expr/vm"
)

// condition is a compiled expression with what it reads from steps.
type condition struct {
	source  string
	program *vm.Program
	// steps lists the node ids the expression names as steps.<id>; when
	// dynamic is false these are the only step outputs it can read, so the
	// evaluation environment holds just them.
	steps   []string
	refs    []stepRef
	dynamic bool
	// result is the static type of the result, from the unguarded
	// compile (the guard's calls return any).
	result reflect.Type
}

// conditions caches compiled expressions; it is shared by the copies of a
// Workflow and safe for concurrent use.
type conditions struct {
	mu   sync.RWMutex
	byEx map[string]*condition
}

func (c *conditions) get(src string) (*condition, error) {
	c.mu.RLock()
	cond, ok := c.byEx[src]
	c.mu.RUnlock()
	if ok {
		return cond, nil
	}
	cond, err := compileCondition(src)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if have, ok := c.byEx[src]; ok {
		return have, nil
	}
	if c.byEx == nil {
		c.byEx = map[string]*condition{}
	}
	c.byEx[src] = cond
	return cond, nil
}

// exprEnv is what an expression sees. The values' shapes are unknown at
// compile time, so member access on them is checked at run time.
type exprEnv struct {
	Input any            `expr:"input"`
	Steps map[string]any `expr:"steps"`
	// state is the evaluation's budget, read by the guarded functions
	// through $env; expressions cannot see unexported fields.
	state *evalState
}

// Builtins that read the clock or the machine's time zones, or whose result
// depends on map iteration order. keys, values and toPairs are replaced by
// sorted versions; the others are gone.
var nondeterministicBuiltins = []string{"now", "date", "timezone", "keys", "values", "toPairs"}

func exprOptions() []expr.Option {
	opts := []expr.Option{expr.Env(&exprEnv{})}
	for _, name := range nondeterministicBuiltins {
		opts = append(opts, expr.DisableBuiltin(name))
	}
	return append(opts,
		expr.Function("keys", sortedKeys, new(func(map[string]any) []any)),
		expr.Function("values", sortedValues, new(func(map[string]any) []any)),
		expr.Function("toPairs", sortedPairs, new(func(map[string]any) []any)),
	)
}

func mapArg(name string, params []any) (map[string]any, error) {
	if len(params) != 1 {
		return nil, fmt.Errorf("%s takes 1 argument, got %d", name, len(params))
	}
	m, ok := params[0].(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s: want an object, got %T", name, params[0])
	}
	return m, nil
}

func sortedKeys(params ...any) (any, error) {
	m, err := mapArg("keys", params)
	if err != nil {
		return nil, err
	}
	out := make([]any, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, k)
	}
	return out, nil
}

func sortedValues(params ...any) (any, error) {
	m, err := mapArg("values", params)
	if err != nil {
		return nil, err
	}
	out := make([]any, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, m[k])
	}
	return out, nil
}

func sortedPairs(params ...any) (any, error) {
	m, err := mapArg("toPairs", params)
	if err != nil {
		return nil, err
	}
	out := make([]any, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, []any{k, m[k]})
	}
	return out, nil
}

// ExprError reports an expression that does not compile or fails to run.
// An evaluation stopped by a bound matches ErrEvalLimit, and one stopped
// because its context ended matches the context's error.
type ExprError struct {
	Expression string
	// Line and Column locate the problem (1-based); 0 when unknown.
	Line, Column int
	Message      string
	// Hint says what to do, when there is something to say.
	Hint string
	// Err is the underlying error, when there is one to match.
	Err error
}

// Unwrap returns the underlying error.
func (e *ExprError) Unwrap() error { return e.Err }

func (e *ExprError) Error() string {
	s := e.Message
	switch {
	case e.Line > 1:
		s += fmt.Sprintf(" at line %d, column %d", e.Line, e.Column)
	case e.Column > 0:
		s += fmt.Sprintf(" at column %d", e.Column)
	}
	if e.Hint != "" {
		s += " (" + e.Hint + ")"
	}
	return s
}

func exprError(src string, err error) *ExprError {
	e := &ExprError{Expression: src, Message: err.Error(), Err: err}
	var fe *file.Error
	if errors.As(err, &fe) {
		e.Message = fe.Message
		if fe.Line > 0 {
			e.Line = fe.Line
			e.Column = fe.Column + 1
		}
	}
	if e.Message == "memory budget exceeded" { // expr's VM panics with this string
		e.Message = fmt.Sprintf("%v: more than %d array, map or range items", ErrEvalLimit, MaxEvalItems)
		e.Err = ErrEvalLimit
	}
	if name, ok := strings.CutPrefix(e.Message, "unknown name "); ok {
		e.Hint = "an expression can use input and steps"
		if slices.Contains(nondeterministicBuiltins, name) {
			e.Hint = name + " is not available: a condition must give the same result when a run is replayed"
		}
	}
	return e
}

// compileCondition checks the expression's size and nesting, parses it,
// refuses constants past the evaluation budget, type-checks it as written
// and compiles it with the guard (see guard.go).
func compileCondition(src string) (*condition, error) {
	if e := checkExprShape(src); e != nil {
		return nil, e
	}
	tree, err := parser.Parse(src)
	if err != nil {
		return nil, exprError(src, err)
	}
	if fe := checkStaticLimits(tree.Node); fe != nil {
		e := exprError(src, fe.Bind(file.NewSource(src)))
		e.Err = ErrEvalLimit
		return nil, e
	}
	checked, err := expr.Compile(src, exprOptions()...)
	if err != nil {
		return nil, exprError(src, err)
	}
	program, err := expr.Compile(src, append(exprOptions(), guardOptions()...)...)
	if err != nil {
		return nil, exprError(src, err)
	}
	refs := stepRefs(tree.Node)
	c := &condition{source: src, program: program, refs: refs.refs, dynamic: refs.dynamic,
		result: checked.Node().Type()}
	for _, r := range refs.refs {
		if !slices.Contains(c.steps, r.id) {
			c.steps = append(c.steps, r.id)
		}
	}
	return c, nil
}

// stepRef is one constant steps.<id> in an expression, with the member read
// from it: "" when none, "[]" when it is not a constant.
type stepRef struct {
	id     string
	member string
}

// refVisitor collects the steps.<id> an expression names. ast.Walk visits
// children before their parent, so steps.<id> is seen before the member
// read from it.
type refVisitor struct {
	refs []stepRef
	// dynamic is set when the expression reaches step outputs other than
	// through a constant steps.<id> (steps[x], $env, steps itself).
	dynamic bool
	idents  int              // uses of the identifier steps
	at      map[ast.Node]int // steps.<id> node → index in refs
}

func stepRefs(node ast.Node) *refVisitor {
	v := &refVisitor{at: map[ast.Node]int{}}
	ast.Walk(&node, v)
	if v.idents != len(v.refs) {
		v.dynamic = true
	}
	return v
}

// Visit implements ast.Visitor.
func (v *refVisitor) Visit(node *ast.Node) {
	switch n := (*node).(type) {
	case *ast.IdentifierNode:
		switch n.Value {
		case rootSteps:
			v.idents++
		case "$env":
			v.dynamic = true
		}
	case *ast.MemberNode:
		if id, ok := n.Node.(*ast.IdentifierNode); ok && id.Value == rootSteps {
			if s, ok := n.Property.(*ast.StringNode); ok {
				v.at[n] = len(v.refs)
				v.refs = append(v.refs, stepRef{id: s.Value})
			}
			return
		}
		if i, ok := v.at[n.Node]; ok {
			v.refs[i].member = "[]"
			if s, ok := n.Property.(*ast.StringNode); ok {
				v.refs[i].member = s.Value
			}
		}
	}
}

// env builds the evaluation environment. Numbers become int (when whole and
// in range) or float64 so that arithmetic and comparisons work; only the
// step outputs the expression can read are converted.
func (c *condition) env(env Env) (exprEnv, error) {
	in, err := exprValue(env.Input)
	if err != nil {
		return exprEnv{}, fmt.Errorf("input: %w", err)
	}
	steps := map[string]any{}
	add := func(id string, out any) error {
		v, err := exprValue(out)
		if err != nil {
			return fmt.Errorf("steps.%s.output: %w", id, err)
		}
		steps[id] = map[string]any{fieldOut: v, fieldStatus: StatusCompleted}
		return nil
	}
	failed := func(id, msg string) {
		steps[id] = map[string]any{fieldOut: nil, fieldStatus: StatusFailed, fieldError: msg}
	}
	if c.dynamic {
		for _, id := range slices.Sorted(maps.Keys(env.Steps)) {
			if err := add(id, env.Steps[id]); err != nil {
				return exprEnv{}, err
			}
		}
		for _, id := range slices.Sorted(maps.Keys(env.Failed)) {
			failed(id, env.Failed[id])
		}
	} else {
		for _, id := range c.steps {
			if out, ok := env.Steps[id]; ok {
				if err := add(id, out); err != nil {
					return exprEnv{}, err
				}
			} else if msg, ok := env.Failed[id]; ok {
				failed(id, msg)
			}
		}
	}
	return exprEnv{Input: in, Steps: steps}, nil
}

// exprValue converts a JSON-shaped value deeply for expression evaluation.
func exprValue(v any) (any, error) {
	v, err := normalize(v)
	if err != nil {
		return nil, err
	}
	switch x := v.(type) {
	case json.Number:
		if i, err := strconv.ParseInt(x.String(), 10, 64); err == nil && i >= math.MinInt && i <= math.MaxInt {
			return int(i), nil
		}
		f, err := x.Float64()
		if err != nil {
			return nil, fmt.Errorf("number %s out of range", x)
		}
		return f, nil
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			if out[k], err = exprValue(e); err != nil {
				return nil, err
			}
		}
		return out, nil
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			if out[i], err = exprValue(e); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	return v, nil
}

// run evaluates the condition within the evaluation bounds; ctx ending
// stops it too. It runs on the caller's goroutine, so when it returns the
// work has stopped.
func (c *condition) run(ctx context.Context, env Env) (any, error) {
	e, err := c.env(env)
	if err != nil {
		return nil, err
	}
	e.state = newEvalState(ctx)
	if err := e.state.spend(0); err != nil {
		return nil, &ExprError{Expression: c.source, Message: err.Error(), Err: err}
	}
	machine := vm.VM{MemoryBudget: MaxEvalItems}
	out, err := machine.Run(c.program, &e)
	if err != nil {
		return nil, exprError(c.source, err)
	}
	return out, nil
}

// resultType reports the static type of the expression's result, or nil if
// it is only known at run time.
func (c *condition) resultType() reflect.Type {
	t := c.result
	if t == nil || t.Kind() == reflect.Interface {
		return nil
	}
	return t
}

// ConditionError reports an edge condition or condition node expression
// that failed to evaluate or gave a result of the wrong type.
type ConditionError struct {
	// Where names the expression's place: "edge draft→review" or
	// `node "check"`.
	Where      string
	Expression string
	Err        error
}

func (e *ConditionError) Error() string {
	return fmt.Sprintf("%s: condition %q: %v", e.Where, clip(e.Expression), e.Err)
}

func (e *ConditionError) Unwrap() error { return e.Err }

// EdgeFires reports whether e fires in env: true for an edge without a
// condition, else the condition's result, which must be a boolean. The
// condition is compiled once (Parse compiles every condition of the
// workflow). It returns a *ConditionError when the expression fails or does
// not give a boolean. A missing value reads as nil: write
// `steps.a.output.flag ?? false` to default it.
func (w *Workflow) EdgeFires(e Edge, env Env) (bool, error) {
	return w.EdgeFiresContext(context.Background(), e, env)
}

// EdgeFiresContext is EdgeFires stopped when ctx ends (cancelling the run
// frees the worker at once), with an error matching ctx.Err(). Within
// ctx, an evaluation is still bounded by EvalTimeout, MaxEvalOps,
// MaxEvalItems and MaxEvalBytes; going past one gives an error matching
// ErrEvalLimit.
func (w *Workflow) EdgeFiresContext(ctx context.Context, e Edge, env Env) (bool, error) {
	if e.Condition == "" {
		return true, nil
	}
	where := "edge " + edgeLabel(e.From, e.To)
	c, err := w.conds().get(e.Condition)
	if err != nil {
		return false, &ConditionError{Where: where, Expression: e.Condition, Err: err}
	}
	out, err := c.run(ctx, env)
	if err != nil {
		return false, &ConditionError{Where: where, Expression: e.Condition, Err: err}
	}
	b, ok := out.(bool)
	if !ok {
		return false, &ConditionError{Where: where, Expression: e.Condition,
			Err: fmt.Errorf("result is %s, want a boolean", describe(out))}
	}
	return b, nil
}

// Eval evaluates expression (a condition node's data.expression) in env and
// returns its result: nil, bool, int, float64, string, []any or
// map[string]any. The expression is compiled once and cached. It returns an
// *ExprError when the expression does not compile or fails to run.
func (w *Workflow) Eval(expression string, env Env) (any, error) {
	return w.EvalContext(context.Background(), expression, env)
}

// EvalContext is Eval stopped when ctx ends, bounded as EdgeFiresContext
// is; a result larger than MaxResultBytes as JSON is refused too.
func (w *Workflow) EvalContext(ctx context.Context, expression string, env Env) (any, error) {
	c, err := w.conds().get(expression)
	if err != nil {
		return nil, err
	}
	out, err := c.run(ctx, env)
	if err != nil {
		return nil, err
	}
	if jsonSize(out, MaxResultBytes, false) > MaxResultBytes {
		return nil, &ExprError{Expression: expression, Err: ErrEvalLimit,
			Message: fmt.Sprintf("%v: the result is over %d bytes as JSON", ErrEvalLimit, MaxResultBytes)}
	}
	return out, nil
}

func (w *Workflow) conds() *conditions {
	if w.exprs == nil {
		// A Workflow not built by Parse: compile on demand, uncached.
		return &conditions{}
	}
	return w.exprs
}

// describe names a value and its type for error messages.
func describe(v any) string {
	if v == nil {
		return "null"
	}
	b, err := marshalCompact(v)
	s := string(b)
	if err != nil {
		s = fmt.Sprint(v)
	}
	if len(s) > 40 {
		s = s[:37] + "..."
	}
	return fmt.Sprintf("%s (%s)", s, cmp.Or(kindName(v), fmt.Sprintf("%T", v)))
}

func kindName(v any) string {
	switch v.(type) {
	case string:
		return "string"
	case int, float64:
		return "number"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return ""
}
