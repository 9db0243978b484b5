package engine

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/palrun/pal/connector"
	"github.com/palrun/pal/provider"
	"github.com/palrun/pal/workflow"
)

// RenderInput renders a node's templates against env and returns the
// step's input as journaled in step_started: an AIInput (ai-step, calling
// the first model of its list), ToolInput, ConnectorInput, ConditionInput,
// ApprovalInput or SubagentInput.
func RenderInput(node *workflow.Node, env workflow.Env) (json.RawMessage, error) {
	return renderInput(node, env, 0)
}

// renderInput is RenderInput for the attempt that calls model fallback of
// an ai-step's list.
func renderInput(node *workflow.Node, env workflow.Env, fallback int) (json.RawMessage, error) {
	switch node.Type {
	case workflow.TypeAIStep:
		d, err := node.AIStep()
		if err != nil {
			return nil, err
		}
		return renderAIStep(d, env, fallback)
	case workflow.TypeTool:
		d, err := node.Tool()
		if err != nil {
			return nil, err
		}
		in, raw := json.RawMessage("null"), d.Input
		if d.MCP != "" {
			in, raw = json.RawMessage("{}"), d.Arguments
		}
		if len(raw) > 0 {
			if in, err = workflow.RenderJSON(raw, env); err != nil {
				return nil, err
			}
		}
		return json.Marshal(ToolInput{Tool: d.Tool, Input: in, MCP: d.MCP})
	case workflow.TypeConnector:
		d, err := node.Connector()
		if err != nil {
			return nil, err
		}
		return renderConnector(d, env)
	case workflow.TypeCondition:
		d, err := node.Condition()
		if err != nil {
			return nil, err
		}
		return json.Marshal(ConditionInput{Expression: d.Expression})
	case workflow.TypeApproval:
		d, err := node.Approval()
		if err != nil {
			return nil, err
		}
		prompt, err := workflow.RenderString(d.Prompt, env)
		if err != nil {
			return nil, fmt.Errorf("prompt: %w", err)
		}
		return json.Marshal(ApprovalInput{Prompt: prompt, Approvers: d.Approvers})
	case workflow.TypeWait:
		d, err := node.Wait()
		if err != nil {
			return nil, err
		}
		return json.Marshal(WaitInput{Signal: d.Signal})
	case workflow.TypeSubagent:
		d, err := node.Subagent()
		if err != nil {
			return nil, err
		}
		in := json.RawMessage("{}")
		if len(d.Input) > 0 {
			if in, err = workflow.RenderJSON(d.Input, env); err != nil {
				return nil, fmt.Errorf("input: %w", err)
			}
		}
		return json.Marshal(SubagentInput{Input: in})
	case workflow.TypeProcess:
		d, err := node.Process()
		if err != nil {
			return nil, err
		}
		return renderProcess(d, env)
	default:
		return nil, fmt.Errorf("node type %q cannot run here", node.Type)
	}
}

func renderAIStep(d *workflow.AIStepData, env workflow.Env, fallback int) (json.RawMessage, error) {
	c := d.Model.Choice(d.Provider, fallback)
	in := AIInput{Provider: c.Provider, Model: c.Model, MaxTokens: d.MaxTokens, Temperature: d.Temperature,
		ResponseSchema: d.ResponseSchema}
	var err error
	if in.System, err = workflow.RenderString(d.System, env); err != nil {
		return nil, fmt.Errorf("system: %w", err)
	}
	for i, m := range d.Messages {
		c, err := workflow.RenderString(m.Content, env)
		if err != nil {
			return nil, fmt.Errorf("messages[%d]: %w", i, err)
		}
		msg := provider.Message{Role: m.Role, Content: c}
		for j, img := range m.Images {
			var part provider.Image
			if part.URL, err = workflow.RenderString(img.URL, env); err != nil {
				return nil, fmt.Errorf("messages[%d].images[%d].url: %w", i, j, err)
			}
			if part.Blob, err = workflow.RenderString(img.Blob, env); err != nil {
				return nil, fmt.Errorf("messages[%d].images[%d].blob: %w", i, j, err)
			}
			if part.Blob != "" {
				part.MediaType = img.MediaType
			}
			msg.Images = append(msg.Images, part)
		}
		in.Messages = append(in.Messages, msg)
	}
	if d.Prompt != "" {
		p, err := workflow.RenderString(d.Prompt, env)
		if err != nil {
			return nil, fmt.Errorf("prompt: %w", err)
		}
		in.Messages = append(in.Messages, provider.Message{Role: provider.RoleUser, Content: p})
	}
	return json.Marshal(in)
}

func renderConnector(d *workflow.ConnectorData, env workflow.Env) (json.RawMessage, error) {
	if d.Kind == workflow.ConnectorEmail {
		return renderEmail(d, env)
	}
	in := ConnectorInput{Kind: d.Kind, Method: d.Method}
	if in.Method == "" {
		in.Method = "POST"
	}
	var err error
	if in.URL, err = workflow.RenderString(d.URL, env); err != nil {
		return nil, fmt.Errorf("url: %w", err)
	}
	if len(d.Headers) > 0 {
		in.Headers = make(map[string]string, len(d.Headers))
		for k, v := range d.Headers {
			if in.Headers[k], err = workflow.RenderString(v, env); err != nil {
				return nil, fmt.Errorf("headers.%s: %w", k, err)
			}
		}
	}
	if len(d.Body) > 0 {
		if in.Body, err = workflow.RenderJSON(d.Body, env); err != nil {
			return nil, fmt.Errorf("body: %w", err)
		}
	}
	return json.Marshal(in)
}

func renderEmail(d *workflow.ConnectorData, env workflow.Env) (json.RawMessage, error) {
	m := &connector.Email{}
	for _, f := range []struct {
		name string
		tmpl string
		out  *string
	}{{"from", d.From, &m.From}, {"to", d.To, &m.To}, {"cc", d.Cc, &m.Cc}, {"subject", d.Subject, &m.Subject},
		{"text", d.Text, &m.Text}, {"html", d.HTML, &m.HTML}} {
		var err error
		if *f.out, err = workflow.RenderString(f.tmpl, env); err != nil {
			return nil, fmt.Errorf("%s: %w", f.name, err)
		}
	}
	return json.Marshal(ConnectorInput{Kind: d.Kind, Email: m})
}

// renderProcess renders a process node's data. The program and the
// environment's names come from the definition: a placeholder in the one
// or a reserved name in the other (which validation refuses) fails the
// step rather than reach the worker.
func renderProcess(d *workflow.ProcessData, env workflow.Env) (json.RawMessage, error) {
	in := ProcessInput{Workdir: d.Workdir, Stdin: json.RawMessage("null"), Limits: d.Limits}
	if d.Network == workflow.NetworkEgress {
		in.Network = d.Network
	}
	if len(d.Command) > 0 && workflow.HasPlaceholder(d.Command[0]) {
		return nil, errors.New("command[0]: the program is part of the definition, not a template")
	}
	for i, a := range d.Command {
		r, err := workflow.RenderString(a, env)
		if err != nil {
			return nil, fmt.Errorf("command[%d]: %w", i, err)
		}
		in.Command = append(in.Command, r)
	}
	if len(d.Env) > 0 {
		in.Env = make(map[string]string, len(d.Env))
		for k, v := range d.Env {
			if msg := workflow.ProcessEnvProblem(k); msg != "" {
				return nil, fmt.Errorf("env.%s: %s", k, msg)
			}
			if workflow.CodeEnv(k) && workflow.HasPlaceholder(v) {
				return nil, fmt.Errorf("env.%s: it chooses code the program loads: set it to a constant, not a template", k)
			}
			r, err := workflow.RenderString(v, env)
			if err != nil {
				return nil, fmt.Errorf("env.%s: %w", k, err)
			}
			in.Env[k] = r
		}
	}
	if len(d.Input) > 0 {
		r, err := workflow.RenderJSON(d.Input, env)
		if err != nil {
			return nil, fmt.Errorf("input: %w", err)
		}
		in.Stdin = r
	}
	return json.Marshal(in)
}
