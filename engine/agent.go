package engine

import (
	"encoding/json"
	"fmt"
	"slices"

	"github.com/palrun/pal/provider"
	"github.com/palrun/pal/workflow"
)

// planAgent replays the agent's turns from the journal: every completed
// model turn and tool call is reused, so a resumed agent sends only the
// turn it was in (or the calls of that turn that had not ended). Each
// turn's request is the whole conversation so far, but its step_started
// journals only the messages added since the previous turn
// (AIInput.Prior counts the earlier ones): the journal grows with the
// turns, not with their square.
func (f *frontier) planAgent(node *workflow.Node, id StepID, env workflow.Env) {
	st := f.st
	sid := id.String()
	d, err := node.Agent()
	if err != nil {
		f.add(invalidNode(sid, err))
		return
	}
	system, err := workflow.RenderString(d.System, env)
	if err != nil {
		f.add(stepFailed(sid, "system: %v", err))
		return
	}
	prompt, err := workflow.RenderString(d.Prompt, env)
	if err != nil {
		f.add(stepFailed(sid, "prompt: %v", err))
		return
	}
	var tools []provider.Tool
	flows := map[string]string{} // tool name → the deployed workflow it starts
	for _, t := range d.Tools {
		switch {
		case t.Workflow != "":
			params := t.Parameters
			if len(params) == 0 {
				params = workflow.AnyObject
			}
			tools = append(tools, provider.Tool{Name: t.ToolName(), Description: t.Description, Parameters: params})
			flows[t.ToolName()] = t.Workflow
		case t.MCP == "":
			tools = append(tools, provider.Tool{Name: t.Name, Description: t.Description, Parameters: t.Parameters})
		}
	}
	// The MCP servers' tools: listed by the worker for the first turn and
	// journaled in its output; every later turn offers that list.
	sources := d.MCPSources()
	var servers map[string]string // tool name → its MCP server

	msgs := []provider.Message{{Role: provider.RoleUser, Content: prompt}}
	sent := 0 // the messages of the previous turn's request
	for k := 0; ; k++ {
		if k >= d.Turns() {
			f.add(Fail{Code: CodeMaxTurns, StepID: sid, Error: fmt.Sprintf("agent %s used all %d turns without a final answer", sid, d.Turns())})
			return
		}
		turn := id.AgentTurn(k)
		tid := turn.String()
		ts := st.Steps[tid]
		if ts == nil || ts.Status != StepCompleted {
			if ts != nil && ts.Status == StepFailed {
				f.add(turnFailed(st, node, sid, k, ts))
				return
			}
			c := d.Model.Choice(d.Provider, fallbackOf(st, tid))
			in := AIInput{Provider: c.Provider, Model: c.Model, System: system, Messages: msgs[sent:],
				Prior: sent, Tools: tools, MaxTokens: d.MaxTokens, Temperature: d.Temperature, ResponseSchema: d.ResponseSchema}
			if k == 0 {
				in.MCP = sources
			}
			f.add(planTurn(st, node, tid, d.TimeoutMs, in, msgs, len(d.Model.Choices(d.Provider))))
			return
		}
		sent = len(msgs)
		var out LLMOutput
		if err := json.Unmarshal(ts.Output, &out); err != nil {
			f.add(stepFailed(tid, "output: %v", err))
			return
		}
		if k == 0 && len(out.MCPTools) > 0 {
			tools = slices.Clip(tools)
			servers = make(map[string]string, len(out.MCPTools))
			for _, t := range out.MCPTools {
				tools = append(tools, provider.Tool{Name: t.Name, Description: t.Description, Parameters: t.Parameters})
				servers[t.Name] = t.Server
			}
		}
		if len(out.ToolCalls) == 0 {
			p := basePlan(st, node, sid, ExecPure)
			p.Input, _ = json.Marshal(AgentInput{Turns: k + 1})
			out, _ := json.Marshal(AgentOutput{Text: out.Text, Turns: k + 1, Confidence: out.Confidence, JSON: out.JSON})
			f.add(pure(p, out))
			return
		}
		msgs = append(msgs, provider.Message{Role: provider.RoleAssistant, Content: out.Text, ToolCalls: out.ToolCalls})
		var done bool
		if msgs, done = f.planToolCalls(node, turn, d.TimeoutMs, out.ToolCalls, msgs, d.ParallelCalls(), servers, flows); !done {
			return
		}
	}
}

// turnFailed is what a failed turn k of the agent sid does: it fails the
// run, or, when the agent's node continues past failures, fails the
// agent's own step (a pure step that fails), which resolves the node.
func turnFailed(st *RunState, node *workflow.Node, sid string, k int, ts *Step) Action {
	msg := fmt.Sprintf("step %s failed: %s", ts.ID, ts.Error)
	if !node.Continues() {
		return Fail{Code: failCode(ts), StepID: ts.ID, Error: msg}
	}
	p := basePlan(st, node, sid, ExecPure)
	p.Input, _ = json.Marshal(AgentInput{Turns: k + 1})
	p.Pure, p.Error, p.Class = true, msg, ts.Class
	return RunStep{Plan: p}
}

// planTurn plans the model turn tid, whose input is in unless journaled:
// its request is the whole conversation msgs. models counts the agent's
// model list.
func planTurn(st *RunState, node *workflow.Node, tid string, timeoutMs int, in AIInput, msgs []provider.Message, models int) Action {
	p := basePlan(st, node, tid, ExecLLM)
	p.TimeoutMs, p.Models = timeoutMs, models
	gateStep(st, node, &p)
	if p.Input == nil {
		p.Input, _ = json.Marshal(in)
	}
	req, err := turnRequest(p.Input, msgs)
	if err != nil {
		return stepFailed(tid, "input: %v", err)
	}
	p.Request = req
	return RunStep{Plan: p}
}

// planToolCalls adds to f the calls of turn that have not ended (all of
// them when parallel, else the first), or, when all have, returns msgs
// with their results added in the model's order and done: a failed
// tool's error is the model's answer, not the run's. servers maps the
// names of MCP tools to their servers, flows the names of workflow tools
// to their deployed workflows: such a call is a subagent step, its child
// run the workflow's, its result the child's output.
func (f *frontier) planToolCalls(node *workflow.Node, turn StepID, timeoutMs int, calls []provider.ToolCall, msgs []provider.Message, parallel bool, servers, flows map[string]string) ([]provider.Message, bool) {
	done := true
	for j, call := range calls {
		cid := turn.ToolCall(j).String()
		if cs := f.st.Steps[cid]; cs != nil && (cs.Status == StepCompleted || cs.Status == StepFailed) {
			continue
		}
		done = false
		if flow, ok := flows[call.Name]; ok {
			p := basePlan(f.st, node, cid, ExecSubagent)
			if p.Input == nil {
				args := call.Arguments
				if len(args) == 0 {
					args = json.RawMessage("{}")
				}
				p.Input, _ = json.Marshal(SubagentInput{Input: args, Workflow: flow})
			}
			f.add(planSubagent(f.st, p))
			if !parallel {
				break
			}
			continue
		}
		p := basePlan(f.st, node, cid, ExecTool)
		p.TimeoutMs = timeoutMs
		if p.Input == nil {
			args := call.Arguments
			if len(args) == 0 {
				args = json.RawMessage("{}")
			}
			p.Input, _ = json.Marshal(ToolInput{Tool: call.Name, Input: args, ToolCallID: call.ID, MCP: servers[call.Name]})
		}
		f.add(RunStep{Plan: p})
		if !parallel {
			break
		}
	}
	if !done {
		return msgs, false
	}
	for j, call := range calls {
		cs := f.st.Steps[turn.ToolCall(j).String()]
		content := string(cs.Output)
		if cs.Status == StepFailed {
			b, _ := json.Marshal(map[string]string{"error": cs.Error})
			content = string(b)
		}
		msgs = append(msgs, provider.Message{Role: provider.RoleTool, ToolCallID: call.ID, Content: content})
	}
	return msgs, true
}

// turnRequest is the whole request of an agent turn whose journaled input
// is input: its settings, with the conversation msgs rebuilt from the
// journal. A turn journaled whole (before turns journaled their new
// messages only) gives the same request.
func turnRequest(input json.RawMessage, msgs []provider.Message) (json.RawMessage, error) {
	var in AIInput
	if err := json.Unmarshal(input, &in); err != nil {
		return nil, err
	}
	if in.Prior > len(msgs) || in.Prior+len(in.Messages) != len(msgs) {
		return nil, fmt.Errorf("the turn journals messages %d to %d, the journal rebuilds %d", in.Prior, in.Prior+len(in.Messages), len(msgs))
	}
	in.Messages, in.Prior = msgs, 0
	return json.Marshal(in)
}
