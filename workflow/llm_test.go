package workflow_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/workflow"
)

// aiWorkflow is a one-step workflow whose ai-step has data.
func aiWorkflow(data string) string {
	return `{"name":"x","nodes":[{"id":"start","type":"trigger"},{"id":"d","type":"ai-step","data":` + data + `}],
	  "edges":[{"from":"start","to":"d"}]}`
}

func TestModelList(t *testing.T) {
	t.Parallel()
	w := mustParse(t, aiWorkflow(`{"model":["openai/gpt-4.1-mini","anthropic/claude-sonnet-4-5"],"prompt":"hi"}`))
	n, _ := w.Node("d")
	d, err := n.AIStep()
	require.NoError(t, err)
	require.Equal(t, workflow.Fallbacks("openai/gpt-4.1-mini", "anthropic/claude-sonnet-4-5"), d.Model)
	require.Equal(t, []workflow.ModelChoice{{Provider: "openai", Model: "gpt-4.1-mini"},
		{Provider: "anthropic", Model: "claude-sonnet-4-5"}}, d.Model.Choices(d.Provider))
	require.Equal(t, workflow.ModelChoice{Provider: "anthropic", Model: "claude-sonnet-4-5"}, d.Model.Choice("", 7),
		"past the end: the last")
	require.Equal(t, []string{"claude-sonnet-4-5", "gpt-4.1-mini"}, w.Models(), "every model of the list is priced")

	raw, err := json.Marshal(d)
	require.NoError(t, err)
	require.Contains(t, string(raw), `"model":["openai/gpt-4.1-mini","anthropic/claude-sonnet-4-5"]`)

	one := mustParse(t, aiWorkflow(`{"provider":"openai","model":"gpt-4o","prompt":"hi"}`))
	n, _ = one.Node("d")
	d, err = n.AIStep()
	require.NoError(t, err)
	require.Equal(t, []workflow.ModelChoice{{Provider: "openai", Model: "gpt-4o"}}, d.Model.Choices(d.Provider))
}

func TestLLMDataProblems(t *testing.T) {
	t.Parallel()
	deep := strings.Repeat(`{"items":`, 40) + `{}` + strings.Repeat(`}`, 40)
	for name, tt := range map[string]struct{ data, want string }{
		"list with provider":       {`{"provider":"openai","model":["openai/a","anthropic/b"],"prompt":"hi"}`, "leave provider out"},
		"entry not provider/model": {`{"model":["gpt-4o"],"prompt":"hi"}`, `"gpt-4o" is not provider/model`},
		"entry twice":              {`{"model":["openai/a","openai/a"],"prompt":"hi"}`, "listed twice"},
		"too many":                 {`{"model":["a/1","a/2","a/3","a/4","a/5","a/6","a/7","a/8","a/9"],"prompt":"hi"}`, "data.model"},
		"one model no provider":    {`{"model":"gpt-4o","prompt":"hi"}`, "data.provider: required with one model"},
		"schema too deep":          {`{"provider":"openai","model":"m","prompt":"hi","responseSchema":` + deep + `}`, "data.responseSchema: nested more than 32 deep"},
		"schema refers out":        {`{"provider":"openai","model":"m","prompt":"hi","responseSchema":{"$ref":"file:///etc/passwd"}}`, "data.responseSchema"},
		"schema not object":        {`{"provider":"openai","model":"m","prompt":"hi","responseSchema":[1]}`, "data.responseSchema"},
		"logprobs on schema": {`{"provider":"openai","model":"m","prompt":"hi","responseSchema":{"type":"object"},
			"confidence":{"min":0.5,"source":"logprobs"}}`, `not "logprobs"`},
		"logprobs on a listed anthropic": {`{"model":["openai/a","anthropic/b"],"prompt":"hi","confidence":{"min":0.5,"source":"logprobs"}}`,
			`provider "anthropic" returns no log probabilities`},
		"image both":                  {`{"provider":"openai","model":"m","messages":[{"role":"user","content":"x","images":[{"url":"https://x/a.png","blob":"ab","mediaType":"image/png"}]}]}`, "give url or blob"},
		"image no type":               {`{"provider":"openai","model":"m","messages":[{"role":"user","content":"x","images":[{"blob":"ab"}]}]}`, "mediaType: required with blob"},
		"image assistant":             {`{"provider":"openai","model":"m","messages":[{"role":"assistant","content":"x","images":[{"url":"https://x/a.png"}]}]}`, "only user messages carry images"},
		"image bad type":              {`{"provider":"openai","model":"m","messages":[{"role":"user","content":"x","images":[{"blob":"ab","mediaType":"image/tiff"}]}]}`, "mediaType"},
		"image bad ref":               {`{"provider":"openai","model":"m","messages":[{"role":"user","content":"x","images":[{"url":"{{steps.nope.output}}"}]}]}`, "images[0].url"},
		"agent list+prov":             {`{"provider":"openai","model":["openai/a"],"prompt":"hi"}`, "leave provider out"},
		"window without thread":       {`{"provider":"openai","model":"m","prompt":"hi","threadWindow":4}`, "data.threadWindow: applies to a thread step"},
		"agent window without thread": {`{"provider":"openai","model":"m","prompt":"hi","threadWindow":4,"thread":false}`, "data.threadWindow: applies to a thread step"},
		"window zero":                 {`{"provider":"openai","model":"m","prompt":"hi","thread":true,"threadWindow":0}`, "threadWindow"},
		"thread not bool":             {`{"provider":"openai","model":"m","prompt":"hi","thread":"yes"}`, "thread"},
	} {
		raw := aiWorkflow(tt.data)
		if strings.HasPrefix(name, "agent") {
			raw = strings.Replace(raw, `"ai-step"`, `"agent"`, 1)
		}
		_, err := workflow.Parse([]byte(raw))
		require.ErrorIs(t, err, workflow.ErrInvalid, name)
		require.ErrorContains(t, err, tt.want, name)
	}

	w := mustParse(t, aiWorkflow(`{"provider":"openai","model":"m","messages":[{"role":"user","content":"look",
	  "images":[{"url":"https://example.com/{{input.name}}.png"},{"blob":"{{input.sum}}","mediaType":"image/png"}]}],
	  "responseSchema":{"type":"object","properties":{"label":{"type":"string"}},"required":["label"]}}`))
	n, _ := w.Node("d")
	d, err := n.AIStep()
	require.NoError(t, err)
	require.Len(t, d.Messages[0].Images, 2)
	require.JSONEq(t, `{"type":"object","properties":{"label":{"type":"string"}},"required":["label"]}`, string(d.ResponseSchema))

	for _, typ := range []string{`"ai-step"`, `"agent"`} {
		w := mustParse(t, strings.Replace(aiWorkflow(`{"provider":"openai","model":"m","prompt":"hi","thread":true,"threadWindow":6}`), `"ai-step"`, typ, 1))
		n, _ := w.Node("d")
		on, window := workflow.ThreadOf(n)
		require.True(t, on, typ)
		require.Equal(t, 6, window, typ)
	}
}
