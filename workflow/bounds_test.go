package workflow_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/workflow"
)

// edgeWorkflow is a workflow with one conditional edge, the condition
// JSON-quoted into place.
func edgeWorkflow(t testing.TB, cond string) []byte {
	t.Helper()
	q, err := json.Marshal(cond)
	require.NoError(t, err)
	return []byte(`{"name":"bounds","nodes":[{"id":"start","type":"trigger"},{"id":"a","type":"tool","data":{"tool":"t"}}],` +
		`"edges":[{"from":"start","to":"a","condition":` + string(q) + `}]}`)
}

// conditionNodeWorkflow has a condition node with expression expr.
func conditionNodeWorkflow(t testing.TB, expr string) []byte {
	t.Helper()
	q, err := json.Marshal(expr)
	require.NoError(t, err)
	return []byte(`{"name":"bounds","nodes":[{"id":"start","type":"trigger"},{"id":"c","type":"condition","data":{"expression":` +
		string(q) + `}}],"edges":[{"from":"start","to":"c"}]}`)
}

// heapDelta runs f and returns how many bytes it allocated in all (garbage
// included), a bound on how far the heap could have grown.
func heapDelta(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// slack is how late past a bound a test lets an evaluation stop.
var slack = map[bool]time.Duration{false: 500 * time.Millisecond, true: 5 * time.Second}[raceEnabled]

func cpuTime(t *testing.T) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	require.NoError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func TestParseRefusesOversizeAndDeepExpressions(t *testing.T) {
	t.Parallel()
	// The workflow of the report: ~900,000 nested "(" under the API's
	// 1 MiB body limit used to overflow the parser's goroutine stack.
	deep := strings.Repeat("(", 900_000) + "true" + strings.Repeat(")", 900_000)[:100]
	_, err := workflow.Parse(edgeWorkflow(t, deep))
	var ve *workflow.ValidationError
	require.ErrorAs(t, err, &ve)
	require.ErrorIs(t, err, workflow.ErrInvalid)
	require.Equal(t, `workflow "bounds": edge start→a: condition: expression is 900104 bytes, longer than the 4096 allowed`, err.Error())

	// Short enough, but nested past MaxExpressionDepth.
	nested := strings.Repeat("[", 65) + strings.Repeat("]", 65) + " == nil"
	_, err = workflow.Parse(conditionNodeWorkflow(t, nested))
	require.ErrorAs(t, err, &ve)
	require.Equal(t, `workflow "bounds": node "c": data.expression: brackets nested deeper than 64 levels at column 65`, err.Error())

	// Brackets in strings and comments do not count; 64 levels are fine.
	ok := `"` + strings.Repeat("(", 200) + `" != "" /* ` + strings.Repeat("{", 200) + ` */ && ` +
		strings.Repeat("(", 63) + "true" + strings.Repeat(")", 63)
	_, err = workflow.Parse(edgeWorkflow(t, ok))
	require.NoError(t, err)

	// A loop's until is checked the same way.
	body := `{"name":"b","nodes":[{"id":"s","type":"trigger"}],"edges":[]}`
	loop := `{"name":"bounds","nodes":[{"id":"start","type":"trigger"},{"id":"l","type":"loop","data":{"until":"` +
		strings.Repeat("(", 5000) + `","body":` + body + `}}],"edges":[{"from":"start","to":"l"}]}`
	_, err = workflow.Parse([]byte(loop))
	require.ErrorAs(t, err, &ve)
	require.Equal(t, `workflow "bounds": node "l": data.until: expression is 5000 bytes, longer than the 4096 allowed`, err.Error())
}

func TestParseRefusesConstantBombs(t *testing.T) {
	t.Parallel()
	tests := []struct{ cond, want string }{
		{`len(repeat(repeat("a", 999999), 999999)) > 0`,
			`repeat would make a string of 999998000001 bytes, more than the 16777216 an expression may allocate at column 5`},
		{`len(repeat("ab" + "cd", 9999999)) > 0`,
			`repeat would make a string of 39999996 bytes, more than the 16777216 an expression may allocate at column 5`},
		{`any(1..5000000, # > 3)`,
			`range 1..5000000 has more items than the 1000000 an expression may create at column 6`},
	}
	for _, tt := range tests {
		t.Run(tt.cond, func(t *testing.T) {
			var err error
			grew := heapDelta(func() { _, err = workflow.Parse(edgeWorkflow(t, tt.cond)) })
			require.Error(t, err)
			require.Equal(t, `workflow "bounds": edge start→a: condition: `+tt.want, err.Error())
			// Refused without building anything: parsing allocates a few
			// hundred KiB in all.
			require.Less(t, grew, uint64(8<<20), "allocated %d bytes", grew)
		})
	}
}

// bigEnv is an input with a 900 KB string, the size of the report's CPU
// bomb, and a 10,000-item array.
func bigEnv(t testing.TB) workflow.Env {
	items := make([]any, 10_000)
	for i := range items {
		items[i] = fmt.Sprintf("item-%d", i)
	}
	return workflow.Env{Input: map[string]any{
		"s": strings.Repeat("a", 900_000), "one": "a", "n": 999_999, "items": items, "items2": append([]any(nil), items...),
	}}
}

func TestEvalMemoryBounded(t *testing.T) {
	t.Parallel()
	env := bigEnv(t)
	tests := []string{
		// The report's bomb with its constants moved into the input, where
		// parsing cannot see them.
		`len(repeat(repeat(input.one, input.n), input.n)) > 0`,
		`len(join(map(1..100000, input.s), "")) > 0`,
		`len(reduce(1..1000, #acc + input.s, "")) > 0`,
		`len(toJSON(map(1..100000, input.s))) > 0`,
		`len(string(map(1..100000, input.s))) > 0`,
		`len(replace(input.s, "", input.s)) > 0`,
		`len(replace(input.s, "a", "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbb")) > 0`,
		`len(flatten(map(1..1000, input.items))) > 0`,
		`len(concat(input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items, input.items)) > 0`,
		`len(map(1..100000, upper(input.s))) > 0`,
		`len(map(1..100000, split(input.s, ""))) > 0`,
		`len(uniq(map(1..100000, #))) > 0`,
		`len(1..input.n * 1000) > 0`,
	}
	for _, cond := range tests {
		t.Run(cond[:min(len(cond), 50)], func(t *testing.T) {
			w, err := workflow.Parse(edgeWorkflow(t, cond))
			require.NoError(t, err)
			e := w.Edges[0]
			var fires bool
			start := time.Now()
			grew := heapDelta(func() { fires, err = w.EdgeFires(e, env) })
			require.ErrorIs(t, err, workflow.ErrEvalLimit, "took %v", time.Since(start))
			require.False(t, fires)
			var ce *workflow.ConditionError
			require.ErrorAs(t, err, &ce)
			// MaxEvalBytes (16 MiB) for the builtins, MaxEvalItems items
			// (at most 16 MiB more) for the VM, and the environment.
			require.Less(t, grew, uint64(64<<20), "allocated %d bytes: %v", grew, err)
			t.Logf("allocated %.1f MiB: %v", float64(grew)/(1<<20), err)
		})
	}

	// A condition node's result becomes a step output: one larger than an
	// event is refused, though building it was cheap.
	w, err := workflow.Parse(conditionNodeWorkflow(t, `map(1..2000, input.s)`))
	require.NoError(t, err)
	d, err := w.Nodes[1].Condition()
	require.NoError(t, err)
	_, err = w.Eval(d.Expression, env)
	require.ErrorIs(t, err, workflow.ErrEvalLimit)
	require.EqualError(t, err, "evaluation limit exceeded: the result is over 1048576 bytes as JSON")
}

// TestEvalTimeBounded runs the report's CPU bomb and checks that it fails
// within EvalTimeout and leaves nothing running: no goroutine, no CPU.
func TestEvalTimeBounded(t *testing.T) {
	// Not parallel: it measures the process's CPU time.
	env := bigEnv(t)
	tests := []struct{ cond, want string }{
		// The report's: each match of 900 KB costs more than one match may.
		{`any(1..999990, {input.s matches "(a|aa)*c"})`,
			"matches: evaluation limit exceeded: matching 900000 bytes against a pattern of 10 instructions costs 140626 operations, more than the 50000 one match may"},
		// 90 KB a match: the operation budget stops it after 14 matches.
		{`any(1..999990, {input.s[0:90000] matches "(a|aa)*c"})`, "matches: evaluation limit exceeded: more than 200000 operations"},
		{`any(1..999990, {# < 0})`, "evaluation limit exceeded: more than 200000 operations"},
		// Each iteration compares two 10,000-item arrays: slow per
		// operation, so the clock stops it before the operation count.
		{`any(1..100000, {input.items != input.items2})`, "evaluation limit exceeded: took longer than 500ms"},
	}
	for _, tt := range tests {
		t.Run(tt.cond, func(t *testing.T) {
			w, err := workflow.Parse(edgeWorkflow(t, tt.cond))
			require.NoError(t, err)
			goroutines := runtime.NumGoroutine()
			start := time.Now()
			_, err = w.EdgeFires(w.Edges[0], env)
			took := time.Since(start)
			require.ErrorIs(t, err, workflow.ErrEvalLimit)
			if !raceEnabled {
				// The race detector slows evaluation tenfold, so the
				// clock may stop it before the operation count does.
				require.ErrorContains(t, err, tt.want)
			}
			// The deadline, plus one operation (a match is at most
			// ~50 ms) and scheduling slack on a loaded machine.
			require.Less(t, took, workflow.EvalTimeout+slack)
			t.Logf("stopped after %v: %v", took, err)

			// Evaluation runs on the caller's goroutine: once it returned,
			// nothing is left burning CPU. (A goroutine of an earlier test
			// may end meanwhile, so the count may drop, never grow.)
			require.LessOrEqual(t, runtime.NumGoroutine(), goroutines)
			// The evaluation's garbage is collected first: the window
			// measures work left running, not the collector's.
			runtime.GC()
			cpu := cpuTime(t)
			idle := time.Now()
			time.Sleep(200 * time.Millisecond) // a window to measure CPU over, not a wait for an event
			spent := cpuTime(t) - cpu
			require.Less(t, spent, 100*time.Millisecond, "CPU used in %v after the evaluation returned", time.Since(idle))
		})
	}
}

func TestEvalContextCancel(t *testing.T) {
	t.Parallel()
	env := bigEnv(t)
	w, err := workflow.Parse(conditionNodeWorkflow(t, `any(1..100000, {input.items != input.items2})`))
	require.NoError(t, err)
	d, err := w.Nodes[1].Condition()
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := w.EvalContext(ctx, d.Expression, env)
		done <- err
	}()
	time.Sleep(50 * time.Millisecond) // let the evaluation get going; it runs up to EvalTimeout otherwise
	cancelled := time.Now()
	cancel()
	err = <-done
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, workflow.ErrEvalLimit)
	require.Less(t, time.Since(cancelled), slack)

	// A context already past its deadline stops the evaluation before it
	// starts; EdgeFiresContext says so the same way.
	ctx, cancel = context.WithTimeout(context.Background(), -time.Second)
	defer cancel()
	_, err = w.EdgeFiresContext(ctx, workflow.Edge{From: "start", To: "c", Condition: "1 in 1..3"}, env)
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

// TestGuardedBuiltinsStillWork checks the guard changes no result.
func TestGuardedBuiltinsStillWork(t *testing.T) {
	t.Parallel()
	w := mustParse(t, conditionWorkflow)
	env := testEnv(t)
	tests := []struct {
		expr string
		want any
	}{
		{`repeat("ab", 3)`, "ababab"},
		{`"a" + "b" + input.text`, "abhello <world> & co"},
		{`input.n + 1`, 4},
		{`upper("x") + lower("Y")`, "Xy"},
		{`join(["a", "b"], "-")`, "a-b"},
		{`replace("aXa", "X", "YY")`, "aYYa"},
		{`toJSON([1])`, "[\n  1\n]"},
		{`string(2)`, "2"},
		{`split("a,b", ",")`, []string{"a", "b"}},
		{`uniq([1, 1, 2])`, []any{1, 2}},
		{`concat([1], [2])`, []any{1, 2}},
		{`flatten([[1], [2, [3]]])`, []any{1, 2, 3}},
		{`sort([3, 1, 2])`, []any{1, 2, 3}},
		{`reverse([1, 2])`, []any{2, 1}},
		{`keys(input.user)`, []any{"age", "name"}},
		{`median([1, 2, 3])`, 2.0},
		{`fromJSON("[1]")`, []any{1.0}},
		{`fromBase64(toBase64("hi"))`, "hi"},
		{`len(filter(1..1000, # % 2 == 0))`, 500},
		{`input.text matches "^hello"`, true},
		{`input.nothing matches "x"`, false},
		{`reduce(1..10, #acc + #, 0)`, 55},
		{`count(steps.fetch.output.items, .url matches "/2$")`, 1},
	}
	for _, tt := range tests {
		got, err := w.Eval(tt.expr, env)
		require.NoError(t, err, tt.expr)
		require.Equal(t, tt.want, got, tt.expr)
	}

	// Errors still name what the author wrote.
	for expr, want := range map[string]string{
		`repeat("a")`:            "not enough arguments to call repeat",
		`input.text matches "("`: "error parsing regexp",
		`"a" + 1 > 0`:            "invalid operation: + (mismatched types string and int)",
	} {
		_, err := w.Eval(expr, env)
		require.ErrorContains(t, err, want, expr)
	}
}

func TestTemplateBounds(t *testing.T) {
	t.Parallel()
	env := bigEnv(t)
	_, err := workflow.RenderString("{{input.s}} and {{input.s}}", env)
	require.ErrorIs(t, err, workflow.ErrEvalLimit)
	require.EqualError(t, err, "template {{input.s}}: evaluation limit exceeded: the rendered text is over 1048576 bytes")

	_, err = workflow.RenderJSON([]byte(`{"a":"{{input.s}}","b":["{{input.s}}"]}`), env)
	require.ErrorIs(t, err, workflow.ErrEvalLimit)
	require.EqualError(t, err, "b[0]: evaluation limit exceeded: the rendered text is over 1048576 bytes")

	_, err = workflow.RenderString(strings.Repeat("{{input.one}}", 1001), env)
	require.EqualError(t, err, "template: more than 1000 placeholders at character 13001")
	_, err = workflow.RenderString("{{input.one}}"+strings.Repeat("x", 256<<10), env)
	require.EqualError(t, err, "template: 262157 bytes, longer than the 262144 allowed for a string with placeholders")

	// Parse reports them, naming node and field.
	prompt, err := json.Marshal(strings.Repeat("{{input.x}}", 1001))
	require.NoError(t, err)
	_, err = workflow.Parse([]byte(`{"name":"t","nodes":[{"id":"start","type":"trigger"},{"id":"a","type":"ai-step","data":{"provider":"p","model":"m","prompt":` +
		string(prompt) + `}}],"edges":[{"from":"start","to":"a"}]}`))
	require.EqualError(t, err, `workflow "t": node "a": data.prompt: template: more than 1000 placeholders at character 11001`)

	deep := strings.Repeat(`{"a":`, 65) + `"{{input.x}}"` + strings.Repeat(`}`, 65)
	_, err = workflow.Parse([]byte(`{"name":"t","nodes":[{"id":"start","type":"trigger"},{"id":"a","type":"tool","data":{"tool":"x","input":` +
		deep + `}}],"edges":[{"from":"start","to":"a"}]}`))
	require.EqualError(t, err, `workflow "t": node "a": data.input: nested deeper than 64 levels (the limit for a value holding templates)`)
}

func TestParseRefusesDeeplyNestedWorkflows(t *testing.T) {
	t.Parallel()
	doc := `{"name":"leaf","nodes":[{"id":"s","type":"trigger"}],"edges":[]}`
	nest := func(levels int) string {
		d := doc
		for range levels {
			d = `{"name":"n","nodes":[{"id":"s","type":"trigger"},{"id":"l","type":"loop","data":{"over":"{{input.x}}","body":` +
				d + `}}],"edges":[{"from":"s","to":"l"}]}`
		}
		return d
	}
	_, err := workflow.Parse([]byte(nest(workflow.MaxWorkflowNesting)))
	require.NoError(t, err)
	_, err = workflow.Parse([]byte(nest(workflow.MaxWorkflowNesting + 1)))
	require.ErrorIs(t, err, workflow.ErrInvalid)
	require.ErrorContains(t, err, "data.body: workflows nested deeper than 8 levels")
	require.True(t, errors.Is(err, workflow.ErrInvalid))
}
