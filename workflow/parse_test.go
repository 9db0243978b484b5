package workflow_test

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/workflow"
)

var update = flag.Bool("update", false, "rewrite testdata/invalid/*.want from the current messages")

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	return raw
}

func mustParse(t testing.TB, raw string) *workflow.Workflow {
	t.Helper()
	w, err := workflow.Parse([]byte(raw))
	require.NoError(t, err)
	return w
}

// TestParseValid parses every testdata/valid/*.json.
func TestParseValid(t *testing.T) {
	t.Parallel()

	files, err := filepath.Glob("testdata/valid/*.json")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".json"), func(t *testing.T) {
			t.Parallel()
			w, err := workflow.Parse(readFile(t, f))
			require.NoError(t, err)
			require.Len(t, w.Order(), len(w.Nodes))
			require.Equal(t, workflow.TypeTrigger, w.Trigger().Type)
			require.Equal(t, w.Trigger().ID, w.Order()[0])
		})
	}
}

// TestParseInvalid parses every testdata/invalid/*.json and compares the
// error with the .want file beside it (go test -run TestParseInvalid
// -update rewrites them; review the diff).
func TestParseInvalid(t *testing.T) {
	t.Parallel()

	files, err := filepath.Glob("testdata/invalid/*.json")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, f := range files {
		name := strings.TrimSuffix(f, ".json")
		t.Run(filepath.Base(name), func(t *testing.T) {
			t.Parallel()
			w, err := workflow.Parse(readFile(t, f))
			require.Nil(t, w)
			require.ErrorIs(t, err, workflow.ErrInvalid)
			var ve *workflow.ValidationError
			require.ErrorAs(t, err, &ve)
			require.NotEmpty(t, ve.Problems)
			if *update {
				require.NoError(t, os.WriteFile(name+".want", []byte(err.Error()+"\n"), 0o644))
				return
			}
			want := strings.TrimSpace(string(readFile(t, name+".want")))
			require.Equal(t, want, err.Error())
		})
	}
}

func TestValidationErrorProblems(t *testing.T) {
	t.Parallel()

	_, err := workflow.Parse(readFile(t, "testdata/invalid/many_problems.json"))
	var ve *workflow.ValidationError
	require.ErrorAs(t, err, &ve)
	require.Equal(t, "summarise", ve.Workflow)
	require.Equal(t, []workflow.Problem{
		{Edge: -1, Field: "version", Message: "unknown field (want one of edges, name, nodes, policy, queue)"},
		{NodeID: "draft", Edge: -1, Field: "data.model", Message: "missing required field (an ai-step needs provider, model, and prompt or messages)"},
		{NodeID: "draft", Edge: -1, Field: "data", Message: "needs prompt or messages"},
		{NodeID: "y", Edge: -1, Message: "unknown type \"z\" (want one of trigger, ai-step, tool, connector, condition, approval, loop, subagent, agent, process, wait)"},
	}, ve.Problems[:4])
	edge := ve.Problems[4]
	require.Equal(t, 0, edge.Edge)
	require.Equal(t, "extra", edge.Field)
	require.Equal(t, "edge start→draft: extra: unknown field (want one of condition, from, to)", edge.String())

	_, err = workflow.Parse(readFile(t, "testdata/invalid/condition_syntax.json"))
	require.ErrorAs(t, err, &ve)
	require.Len(t, ve.Problems, 1)
	require.Equal(t, 1, ve.Problems[0].Edge)
	require.Equal(t, "condition", ve.Problems[0].Field)
	require.Equal(t, "", ve.Problems[0].NodeID)
}

func TestParseErrorsAreNotWrappedSchemaErrors(t *testing.T) {
	t.Parallel()

	// A bad workflow is ErrInvalid; nothing else is.
	_, err := workflow.Parse([]byte(`{`))
	require.True(t, errors.Is(err, workflow.ErrInvalid))
	require.EqualError(t, err, "workflow: invalid JSON at line 1 column 2: unexpected end of input")
}

const diamond = `{
  "name": "diamond",
  "nodes": [
    {"id": "d", "type": "tool", "data": {"tool": "join", "retry": {"maxAttempts": 4, "backoffMs": 250, "retryableClasses": ["tool"]}}},
    {"id": "c", "type": "tool", "data": {"tool": "right"}},
    {"id": "start", "type": "trigger"},
    {"id": "b", "type": "tool", "data": {"tool": "left"}},
    {"id": "e", "type": "condition", "data": {"expression": "steps.d.output.ok"}}
  ],
  "edges": [
    {"from": "b", "to": "d"},
    {"from": "start", "to": "c"},
    {"from": "start", "to": "b"},
    {"from": "c", "to": "d", "condition": "steps.c.output.go"},
    {"from": "d", "to": "e"}
  ]
}`

func TestGraphAccessors(t *testing.T) {
	t.Parallel()

	w := mustParse(t, diamond)
	require.Equal(t, "diamond", w.Name)
	// c is declared before b, so among the trigger's successors it comes first.
	require.Equal(t, []string{"start", "c", "b", "d", "e"}, w.Order())

	require.Equal(t, []workflow.Edge{{From: "b", To: "d"}, {From: "c", To: "d", Condition: "steps.c.output.go"}}, w.Incoming("d"))
	require.Equal(t, []workflow.Edge{{From: "start", To: "c"}, {From: "start", To: "b"}}, w.Outgoing("start"))
	require.Nil(t, w.Incoming("start"))
	require.Nil(t, w.Outgoing("e"))
	require.Nil(t, w.Outgoing("nope"))

	n, ok := w.Node("b")
	require.True(t, ok)
	require.Equal(t, workflow.TypeTool, n.Type)
	_, ok = w.Node("zz")
	require.False(t, ok)
	require.Equal(t, "start", w.Trigger().ID)

	// Order returns a copy.
	o := w.Order()
	o[0] = "changed"
	require.Equal(t, "start", w.Order()[0])
}

func TestRawAndHash(t *testing.T) {
	t.Parallel()

	w := mustParse(t, diamond)
	require.True(t, json.Valid(w.Raw()))
	require.NotContains(t, string(w.Raw()), "\n")
	require.True(t, strings.HasPrefix(string(w.Raw()), `{"name":"diamond","nodes":[{"id":"d",`), "keys keep their order")
	require.Len(t, w.Hash(), 64)

	// Whitespace does not change the hash; content does.
	w2 := mustParse(t, string(w.Raw()))
	require.Equal(t, w.Hash(), w2.Hash())
	require.Equal(t, w.Raw(), w2.Raw())
	w3 := mustParse(t, strings.Replace(diamond, `"join"`, `"join2"`, 1))
	require.NotEqual(t, w.Hash(), w3.Hash())

	// The known hash of a fixed document.
	w4 := mustParse(t, `{ "name": "noop", "nodes": [ {"id": "start", "type": "trigger"} ] }`)
	require.Equal(t, `{"name":"noop","nodes":[{"id":"start","type":"trigger"}]}`, string(w4.Raw()))
	require.Equal(t, "d86b96663d002c8924168446119ea006a2f384ab3b22e32533252043a271363f", w4.Hash())
}

func TestTypedAccessors(t *testing.T) {
	t.Parallel()

	w := mustParse(t, string(readFile(t, "testdata/valid/branching.json")))

	n, _ := w.Node("classify")
	ai, err := n.AIStep()
	require.NoError(t, err)
	require.Equal(t, "openai", ai.Provider)
	require.Equal(t, workflow.ModelOf("gpt-4o-mini"), ai.Model)
	require.Equal(t, []workflow.Message{{Role: "user", Content: "Label: {{ input.ticket.body }}"}}, ai.Messages)
	require.Equal(t, 64, ai.MaxTokens)
	require.NotNil(t, ai.Temperature)
	require.Zero(t, *ai.Temperature)
	require.Nil(t, n.Retry())
	require.Equal(t, 1, n.Retry().Attempts())

	_, err = n.Tool()
	var wt *workflow.WrongTypeError
	require.ErrorAs(t, err, &wt)
	require.EqualError(t, err, `node "classify" is of type "ai-step", not "tool"`)

	n, _ = w.Node("fetch")
	tool, err := n.Tool()
	require.NoError(t, err)
	require.Equal(t, workflow.HTTPToolName, tool.Tool)
	require.JSONEq(t, `{"url":"https://api.example.test/users/{{input.ticket.user_id}}","ids":"{{input.ids}}","nested":[{"first":"{{input.ids[0]}}"}],"n":3}`, string(tool.Input))
	require.Equal(t, &workflow.RetryPolicy{MaxAttempts: 2, RetryableClasses: []string{"tool", "timeout"}}, n.Retry())

	n, _ = w.Node("page")
	c, err := n.Connector()
	require.NoError(t, err)
	require.Equal(t, workflow.ConnectorWebhook, c.Kind)
	require.Equal(t, "PUT", c.Method)
	require.Equal(t, map[string]string{"X-Ticket": "{{input.ticket.id}}"}, c.Headers)
	require.Equal(t, 5, n.Retry().Attempts())
	require.True(t, n.Retry().Retries("connector"))
	require.Zero(t, n.Retry().Backoff())

	n, _ = w.Node("urgent")
	cond, err := n.Condition()
	require.NoError(t, err)
	require.Contains(t, cond.Expression, "steps.classify.output.label")
	_, err = n.AIStep()
	require.ErrorAs(t, err, &wt)
	_, err = n.Connector()
	require.ErrorAs(t, err, &wt)
	_, err = w.Trigger().Condition()
	require.ErrorAs(t, err, &wt)
	require.Nil(t, w.Trigger().Retry())
}

func TestProcessNodeValidation(t *testing.T) {
	t.Parallel()
	ok := `{"name":"p","nodes":[{"id":"start","type":"trigger"},
		{"id":"work","type":"process","data":{"command":["python3","agent.py","{{input.topic}}"],"env":{"A":"{{input.topic}}"},
		 "workdir":"/tmp","timeoutMs":1000,"limits":{"memoryMb":64,"cpuSeconds":5}}}],"edges":[{"from":"start","to":"work"}]}`
	wf, err := workflow.Parse([]byte(ok))
	require.NoError(t, err)
	n, found := wf.Node("work")
	require.True(t, found)
	d, err := n.Process()
	require.NoError(t, err)
	require.Equal(t, workflow.DefaultMaxResumes, d.Resumes())

	for name, tc := range map[string]struct{ data, want string }{
		"no command":    {`{}`, "a process node needs command"},
		"empty command": {`{"command":[]}`, "data.command"},
		"PAL_ env":      {`{"command":["x"],"env":{"PAL_RESUME":"0"}}`, "names starting with PAL_ are set by PAL"},
		"bad env name":  {`{"command":["x"],"env":{"1A":"x"}}`, "data.env"},
		"bad template":  {`{"command":["{{steps.nope.output}}"]}`, `no node "nope"`},
		"tiny memory":   {`{"command":["x"],"limits":{"memoryMb":1}}`, "memoryMb"},
		"negative max":  {`{"command":["x"],"maxResumes":-1}`, "maxResumes"},
		"zero procs":    {`{"command":["x"],"limits":{"maxProcesses":0}}`, "maxProcesses"},
		"bad network":   {`{"command":["x"],"network":"host"}`, "network"},
		"odd network":   {`{"command":["x"],"network":"everywhere"}`, "network"},
	} {
		doc := `{"name":"p","nodes":[{"id":"start","type":"trigger"},{"id":"work","type":"process","data":` + tc.data +
			`}],"edges":[{"from":"start","to":"work"}]}`
		_, err := workflow.Parse([]byte(doc))
		require.Error(t, err, name)
		require.Contains(t, err.Error(), tc.want, name)
	}
}

// TestProcessInputIsData: what arrives in data may fill an argument or an
// environment value, never choose the program, the code a shell or an
// interpreter runs, or a variable that makes the program load code.
func TestProcessInputIsData(t *testing.T) {
	t.Parallel()
	parse := func(data string) error {
		doc := `{"name":"p","nodes":[{"id":"start","type":"trigger"},{"id":"work","type":"process","data":` + data +
			`}],"edges":[{"from":"start","to":"work"}]}`
		_, err := workflow.Parse([]byte(doc))
		return err
	}
	for _, ok := range []string{
		`{"command":["python3","/opt/agent.py","{{input.topic}}"]}`,
		`{"command":["/bin/sh","-c","echo \"$1\"","sh","{{input.name}}"]}`,
		`{"command":["python3","-c","import sys; print(sys.argv[1])","{{input.name}}"]}`,
		`{"command":["bash","-euc","printf %s \"$1\"","bash","{{input.name}}"]}`,
		`{"command":["/usr/bin/awk","{print}","{{input.file}}"]}`,
		`{"command":["echo","\\{{not a template}}"]}`,
		`{"command":["x"],"env":{"PYTHONPATH":"/opt/sdk","NAME":"{{input.name}}","LANG":"C.UTF-8"}}`,
		`{"command":["x"],"network":"egress","limits":{"maxProcesses":4,"fileSizeMb":1,"workdirMb":8}}`,
	} {
		require.NoError(t, parse(ok), ok)
	}
	for _, tc := range []struct{ data, field, want string }{
		{`{"command":["{{input.prog}}","-c","id"]}`, "data.command[0]", "the program is part of the definition"},
		{`{"command":["/usr/bin/{{input.prog}}"]}`, "data.command[0]", "not a template"},
		{`{"command":["bin/agent"]}`, "data.command[0]", `not the relative path "bin/agent"`},
		{`{"command":["sh","-c","echo hello {{input.name}}"]}`, "data.command[2]", "could become shell code"},
		{`{"command":["/bin/bash","-ec","echo {{input.name}}"]}`, "data.command[2]", "could become shell code"},
		{`{"command":["sh","-e","-c","echo {{input.name}}"]}`, "data.command[3]", "the command string"},
		{`{"command":["sh","{{input.script}}"]}`, "data.command[1]", "the script argument"},
		{`{"command":["python3.11","-c","print('{{input.name}}')"]}`, "data.command[2]", "the code argument"},
		{`{"command":["python3","-m","{{input.module}}"]}`, "data.command[2]", "could become code"},
		{`{"command":["python3","{{input.script}}"]}`, "data.command[1]", "the script argument"},
		{`{"command":["node","--eval={{input.js}}"]}`, "data.command[1]", "an option"},
		{`{"command":["perl","-e","print '{{input.x}}'"]}`, "data.command[2]", "could become code"},
		{`{"command":["awk","{print \"{{input.x}}\"}"]}`, "data.command[1]", "the script argument"},
		{`{"command":["env","{{input.prog}}"]}`, "data.command[1]", "env starts another program"},
		{`{"command":["/usr/bin/xargs","-0","{{input.x}}"]}`, "data.command[2]", "xargs starts another program"},
		{`{"command":["x"],"env":{"PATH":"/tmp"}}`, "data.env.PATH", "may not set it"},
		{`{"command":["x"],"env":{"LD_PRELOAD":"/tmp/x.so"}}`, "data.env.LD_PRELOAD", "LD_"},
		{`{"command":["x"],"env":{"BASH_ENV":"/tmp/x"}}`, "data.env.BASH_ENV", "may not set it"},
		{`{"command":["x"],"env":{"HTTPS_PROXY":"http://evil"}}`, "data.env.HTTPS_PROXY", "may not set it"},
		{`{"command":["x"],"env":{"PYTHONPATH":"{{input.path}}"}}`, "data.env.PYTHONPATH", "set it to a constant"},
		{`{"command":["x"],"env":{"NODE_OPTIONS":"--require {{input.m}}"}}`, "data.env.NODE_OPTIONS", "set it to a constant"},
		{`{"command":["x"],"workdir":"{{input.dir}}"}`, "data.workdir", "not a template"},
	} {
		err := parse(tc.data)
		require.Error(t, err, tc.data)
		var ve *workflow.ValidationError
		require.ErrorAs(t, err, &ve, tc.data)
		found := false
		for _, p := range ve.Problems {
			if p.Field == tc.field && strings.Contains(p.Message, tc.want) {
				found = true
			}
		}
		require.True(t, found, "%s: want %s: %s, got %v", tc.data, tc.field, tc.want, err)
	}
}

func TestParsePolicy(t *testing.T) {
	t.Parallel()
	const base = `{"name":"p","nodes":[{"id":"start","type":"trigger"}],"policy":%s}`
	wf, err := workflow.Parse([]byte(fmt.Sprintf(base, `{"budget":{"maxCostUsd":1.5,"maxSteps":20,"warnAt":0.5,"onExceed":"pause"},
		"anomalies":{"runaway_loop":{"threshold":3,"action":"halt"},"cost_spike":{"threshold":4,"floor":0.2}}}`)))
	require.NoError(t, err)
	require.Equal(t, &workflow.Budget{MaxCostUSD: 1.5, MaxSteps: 20, WarnAt: 0.5, OnExceed: "pause"}, wf.Policy.Budget)
	require.Equal(t, workflow.AnomalyRule{Threshold: 3, Action: "halt"}, wf.Policy.Anomalies["runaway_loop"])
	for _, bad := range []string{
		`{"budget":{"maxCostUsd":-1}}`, `{"budget":{"maxCostUsd":0}}`, `{"budget":{"warnAt":1.5}}`,
		`{"budget":{"onExceed":"explode"}}`, `{"budget":{"maxTokens":1.5}}`, `{"budget":{"maxUsd":1}}`,
		`{"anomalies":{"loopy":{}}}`, `{"anomalies":{"retry_storm":{"action":"panic"}}}`, `{"anomalies":{"retry_storm":{"threshold":0}}}`,
		`{"other":1}`,
	} {
		_, err := workflow.Parse([]byte(fmt.Sprintf(base, bad)))
		require.ErrorIs(t, err, workflow.ErrInvalid, bad)
		require.ErrorContains(t, err, "policy", bad)
	}
}
