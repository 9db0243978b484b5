package workflow_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/workflow"
)

// decode decodes JSON the way step outputs are stored: with UseNumber.
func decode(t testing.TB, s string) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader([]byte(s)))
	dec.UseNumber()
	var v any
	require.NoError(t, dec.Decode(&v))
	return v
}

func testEnv(t testing.TB) workflow.Env {
	return workflow.Env{
		Input: decode(t, `{"text":"hello <world> & co","n":3,"big":12345678901234567890,"ratio":0.25,
			"tags":["a","b"],"user":{"name":"Ada","age":36},"nothing":null,"yes":true}`),
		Steps: map[string]any{
			"draft": decode(t, `{"text":"a summary","score":0.91,"usage":{"tokens":42}}`),
			"fetch": decode(t, `{"items":[{"url":"https://a.test/1"},{"url":"https://a.test/2"}],"count":2}`),
			// A step output may also be given raw.
			"raw": json.RawMessage(`{"ok":true,"list":[1,2.5]}`),
		},
	}
}

func TestRenderString(t *testing.T) {
	t.Parallel()

	env := testEnv(t)
	tests := []struct {
		name, in, want string
	}{
		{"no placeholder", "plain text", "plain text"},
		{"empty", "", ""},
		{"input field", "Summarise: {{input.text}}", "Summarise: hello <world> & co"},
		{"whitespace inside braces", "{{  input.text\t}}!", "hello <world> & co!"},
		{"step output", "Check: {{steps.draft.output.text}}", "Check: a summary"},
		{"array index", "{{steps.fetch.output.items[1].url}}", "https://a.test/2"},
		{"number as written", "n={{input.n}} big={{input.big}} r={{input.ratio}}", "n=3 big=12345678901234567890 r=0.25"},
		{"object as compact JSON", "user: {{input.user}}", `user: {"age":36,"name":"Ada"}`},
		{"array as compact JSON", "tags: {{input.tags}}", `tags: ["a","b"]`},
		{"no HTML escaping in JSON", "{{input}}", `{"big":12345678901234567890,"n":3,"nothing":null,"ratio":0.25,"tags":["a","b"],"text":"hello <world> & co","user":{"age":36,"name":"Ada"},"yes":true}`},
		{"null and bool", "{{input.nothing}}/{{input.yes}}", "null/true"},
		{"raw output", "{{steps.raw.output.list[1]}} {{steps.raw.output}}", `2.5 {"list":[1,2.5],"ok":true}`},
		{"several", "{{input.user.name}} is {{input.user.age}}; {{steps.fetch.output.count}} items", "Ada is 36; 2 items"},
		{"escaped braces", `literal \{{input.text}} and {{input.n}}`, "literal {{input.text}} and 3"},
		{"lone closing braces", "a }} b", "a }} b"},
		{"unicode around", "→ {{input.user.name}} ←", "→ Ada ←"},
		{"a secret stays a reference", "https://h/?key={{ secrets.API_KEY }}&q={{input.n}}", "https://h/?key={{secrets.API_KEY}}&q=3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := workflow.RenderString(tt.in, env)
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

func TestRenderStringErrors(t *testing.T) {
	t.Parallel()

	env := testEnv(t)
	tests := []struct {
		in, want string
	}{
		{"{{steps.draft.output.txt}}", `template {{steps.draft.output.txt}}: steps.draft.output has no field "txt"`},
		{"{{ steps.draft.output.usage.tokens.x }}", `template {{steps.draft.output.usage.tokens.x}}: steps.draft.output.usage.tokens is a number, not an object`},
		{"{{steps.fetch.output.items[2].url}}", `template {{steps.fetch.output.items[2].url}}: steps.fetch.output.items has no index 2 (length 2)`},
		{"{{steps.fetch.output.items.url}}", `template {{steps.fetch.output.items.url}}: steps.fetch.output.items is an array, not an object (no field "url")`},
		{"{{steps.fetch.output[0]}}", `template {{steps.fetch.output[0]}}: steps.fetch.output is an object, not an array`},
		{"{{input.nothing.x}}", `template {{input.nothing.x}}: input.nothing is null, not an object`},
		{"{{input.text[0]}}", `template {{input.text[0]}}: input.text is a string, not an array`},
		{"{{steps.review.output.text}}", `template {{steps.review.output.text}}: no output for step "review"`},
		{"{{steps.draft}}", `template {{steps.draft}}: steps.draft has no field nothing (want steps.draft.output…)`},
		{"{{steps.draft.text}}", `template {{steps.draft.text}}: steps.draft has no field "text" (want steps.draft.output…)`},
		{"{{steps}}", `template {{steps}}: want steps.<node id>.output…`},
		{"{{secrets}}", `template {{secrets}}: want secrets.<name>`},
		{"{{secrets.a.b}}", `template {{secrets.a.b}}: want secrets.<name>`},
		{"{{secrets[0]}}", `template {{secrets[0]}}: want secrets.<name>`},
		{"{{env.HOME}}", `template {{env.HOME}}: unknown name "env" (a template starts with input, steps or secrets)`},
		{"Hi {{input.text", `template: unclosed "{{" at character 4`},
		{"{{}}", `template: invalid placeholder "{{}}": empty path at character 1`},
		{"x {{input..a}}", `template: invalid placeholder "{{input..a}}": empty name in path at character 3`},
		{"{{input.a.}}", `template: invalid placeholder "{{input.a.}}": path ends with '.' at character 1`},
		{"{{input[0]x}}", `template: invalid placeholder "{{input[0]x}}": unexpected 'x' in path at character 1`},
		{"{{input.a[-1]}}", `template: invalid placeholder "{{input.a[-1]}}": invalid index [-1] (want a number from 0) at character 1`},
		{"{{input.a[1}}", `template: invalid placeholder "{{input.a[1}}": unclosed '[' at character 1`},
		{"{{input.a b}}", `template: invalid placeholder "{{input.a b}}": unexpected ' ' in path at character 1`},
		{"{{[0]}}", `template: invalid placeholder "{{[0]}}": empty name in path at character 1`},
		{"{{input.$x}}", `template: invalid placeholder "{{input.$x}}": unexpected '$' in path (names use letters, digits, '_' and '-') at character 1`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			_, err := workflow.RenderString(tt.in, env)
			require.EqualError(t, err, tt.want)
		})
	}

	_, err := workflow.RenderString("{{steps.draft.output.txt}}", env)
	var te *workflow.TemplateError
	require.ErrorAs(t, err, &te)
	require.Equal(t, "{{steps.draft.output.txt}}", te.Placeholder)
	_, err = workflow.RenderString("{{input", env)
	var se *workflow.TemplateSyntaxError
	require.ErrorAs(t, err, &se)
	require.Equal(t, 0, se.Offset)
}

func TestRenderJSON(t *testing.T) {
	t.Parallel()

	env := testEnv(t)
	tests := []struct {
		name, in, want string
	}{
		{"whole placeholder keeps the value", `{"n":"{{input.n}}","user":"{{input.user}}","tags":"{{ input.tags }}","none":"{{input.nothing}}"}`,
			`{"n":3,"user":{"age":36,"name":"Ada"},"tags":["a","b"],"none":null}`},
		{"embedded placeholder is stringified", `{"msg":"n={{input.n}} user={{input.user}}"}`,
			`{"msg":"n=3 user={\"age\":36,\"name\":\"Ada\"}"}`},
		{"key order and numbers kept", `{"z":1.50,"a":"{{steps.draft.output.score}}","m":[1e3,"{{input.big}}"]}`,
			`{"z":1.50,"a":0.91,"m":[1e3,12345678901234567890]}`},
		{"nested arrays and objects", `[{"url":"{{steps.fetch.output.items[0].url}}"},["{{steps.raw.output.ok}}",false,null]]`,
			`[{"url":"https://a.test/1"},[true,false,null]]`},
		{"keys are not templates", `{"{{input.n}}":"x"}`, `{"{{input.n}}":"x"}`},
		{"top-level string", `"{{input.user.name}}"`, `"Ada"`},
		{"text with html stays as is", `"{{input.text}}!"`, `"hello <world> & co!"`},
		{"escaped braces", `"\\{{input.n}}"`, `"{{input.n}}"`},
		{"whitespace is compacted", "{ \"a\" : [ 1 , 2 ] }", `{"a":[1,2]}`},
		{"scalar", `42`, `42`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := workflow.RenderJSON(json.RawMessage(tt.in), env)
			require.NoError(t, err)
			require.Equal(t, tt.want, string(got))
		})
	}

	got, err := workflow.RenderJSON(nil, env)
	require.NoError(t, err)
	require.Nil(t, got)
}

func TestRenderJSONErrors(t *testing.T) {
	t.Parallel()

	env := testEnv(t)
	tests := []struct {
		in, want string
	}{
		{`{"summary":"{{steps.draft.output.txt}}"}`, `summary: template {{steps.draft.output.txt}}: steps.draft.output has no field "txt"`},
		{`{"a":{"b":["x","{{input.zz}}"]}}`, `a.b[1]: template {{input.zz}}: input has no field "zz"`},
		{`["ok {{input.n"]`, `[0]: template: unclosed "{{" at character 4`},
		{`"{{input.none}}"`, `template {{input.none}}: input has no field "none"`},
		{`{"a":1`, `invalid JSON value: unexpected end of JSON input`},
		{`{"a":1} 2`, `invalid JSON value: invalid character '2' after top-level value`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			_, err := workflow.RenderJSON(json.RawMessage(tt.in), env)
			require.EqualError(t, err, tt.want)
		})
	}
}

func TestRenderIsDeterministic(t *testing.T) {
	t.Parallel()

	env := testEnv(t)
	in := json.RawMessage(`{"all":"{{input}}","text":"{{input}} / {{steps.draft.output}}"}`)
	first, err := workflow.RenderJSON(in, env)
	require.NoError(t, err)
	for range 50 {
		got, err := workflow.RenderJSON(in, env)
		require.NoError(t, err)
		require.Equal(t, string(first), string(got))
	}
}

func TestRenderGoValues(t *testing.T) {
	t.Parallel()

	// Values that did not come from JSON decoding still render.
	type user struct {
		Name string `json:"name"`
	}
	env := workflow.Env{
		Input: map[string]any{"n": 2, "f": 1.5, "u": user{Name: "Lin"}, "list": []string{"x", "y"}},
		Steps: map[string]any{"a": map[string]string{"k": "v"}},
	}
	got, err := workflow.RenderString("{{input.n}} {{input.f}} {{input.u.name}} {{input.list[1]}} {{steps.a.output.k}}", env)
	require.NoError(t, err)
	require.Equal(t, "2 1.5 Lin y v", got)

	out, err := workflow.RenderJSON(json.RawMessage(`{"n":"{{input.n}}","u":"{{input.u}}"}`), env)
	require.NoError(t, err)
	require.Equal(t, `{"n":2,"u":{"name":"Lin"}}`, string(out))
}
