package workers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/internal/redact"
	"github.com/palrun/pal/workflow"
)

// The MCP steps (docs/architecture.md §10.4): a call of one tool, and the
// list an agent's first turn offers, over the connections of mcp.go.

// usable refuses a server whose entry holds secrets in a run of no
// deployed workflow: as in a node's own definition, a secret is sent only
// for what an operator deployed.
func (c *call) usable(s MCPServer) error {
	if c.deployed == nil && len(s.secretNames()) > 0 {
		return permanent("MCP server %s sends secrets (%s), which resolve only in a run of a deployed workflow, and run %s names none: deploy the workflow",
			s.Name, strings.Join(s.secretNames(), ", "), c.d.runID)
	}
	return nil
}

// execMCP calls one MCP tool: a tool node's (data.mcp), or an agent's
// tool call of a server's tool.
func (c *call) execMCP(in engine.ToolInput) (stepResult, error) {
	p, m := c.p, c.d.w.mcp
	s, err := m.server(in.MCP)
	if err != nil {
		return stepResult{}, err
	}
	if err := c.usable(s); err != nil {
		return stepResult{}, err
	}
	ctx, cancel := context.WithTimeout(c.ctx, timeoutOf(p.TimeoutMs, defaultToolTimeout))
	defer cancel()
	conn, err := m.session(ctx, s)
	if err != nil {
		return stepResult{}, c.mcpFailure(ctx, err)
	}
	args := in.Input
	if len(args) == 0 || string(args) == "null" {
		args = json.RawMessage("{}")
	}
	res, err := conn.sess.CallTool(ctx, &mcp.CallToolParams{Meta: mcp.Meta{MCPKeyMeta: p.Key}, Name: in.Tool, Arguments: args})
	if err != nil {
		var we *jsonrpc.Error
		switch {
		case ctx.Err() != nil:
			return stepResult{}, c.mcpFailure(ctx, err)
		case errors.As(err, &we):
			// The server answered: the request is wrong (an unknown tool,
			// bad arguments); the same request gets the same answer.
			return stepResult{}, &ToolError{Err: fmt.Errorf("MCP server %s: tool %s: %s", s.Name, in.Tool, clip(we.Message, 1024))}
		}
		// The connection broke under the call (a crash): the next call
		// starts the server again.
		m.drop(s.Name, conn)
		return stepResult{}, unavailable(s, "tool %s: the connection ended during the call: %v%s", in.Tool, redact.Error(err), conn.stderrTail())
	}
	if res.IsError {
		return stepResult{}, &ToolError{Err: fmt.Errorf("MCP server %s: tool %s answered an error: %s", s.Name, in.Tool, clip(contentText(res.Content), 2048))}
	}
	out, err := json.Marshal(struct {
		Content           []mcp.Content `json:"content"`
		StructuredContent any           `json:"structuredContent,omitempty"`
	}{res.Content, res.StructuredContent})
	if err != nil {
		return stepResult{}, &ToolError{Err: fmt.Errorf("MCP server %s: tool %s: its result: %v", s.Name, in.Tool, err)}
	}
	return stepResult{output: out}, nil
}

// mcpFailure is how a call that ctx ended fails: the drive's end (a lost
// lease, a shutdown) as it is, a timeout as one (retryable, class
// timeout).
func (c *call) mcpFailure(ctx context.Context, err error) error {
	if cause := context.Cause(c.ctx); cause != nil {
		return cause
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("MCP: no answer within the step's timeout: %w", context.DeadlineExceeded)
	}
	return err
}

// contentText is the text of a tool result's content, for an error.
func contentText(cs []mcp.Content) string {
	var b strings.Builder
	for _, c := range cs {
		if t, ok := c.(*mcp.TextContent); ok {
			if b.Len() > 0 {
				b.WriteString("\n")
			}
			b.WriteString(t.Text)
		}
	}
	if b.Len() == 0 {
		return "(no text)"
	}
	return b.String()
}

// mcpTools lists the tools of the servers an agent's first turn offers
// (engine.AIInput.MCP), those of allow only where it is set. taken are
// the names of the agent's other tools: a server's tool of the same name,
// or two servers' tools of one name, fail the turn (the model could not
// tell them apart).
func (c *call) mcpTools(sources []workflow.MCPSource, taken []string) ([]engine.MCPTool, error) {
	m := c.d.w.mcp
	ctx, cancel := context.WithTimeout(c.ctx, timeoutOf(c.p.TimeoutMs, defaultToolTimeout))
	defer cancel()
	owner := map[string]string{}
	for _, n := range taken {
		owner[n] = "the agent's own tools"
	}
	var out []engine.MCPTool
	for _, src := range sources {
		s, err := m.server(src.Server)
		if err != nil {
			return nil, err
		}
		if err := c.usable(s); err != nil {
			return nil, err
		}
		conn, err := m.session(ctx, s)
		if err != nil {
			return nil, c.mcpFailure(ctx, err)
		}
		var listed []string
		n := 0
		for t, err := range conn.sess.Tools(ctx, nil) {
			if err != nil {
				if ctx.Err() != nil {
					return nil, c.mcpFailure(ctx, err)
				}
				m.drop(s.Name, conn)
				return nil, unavailable(s, "listing its tools: %v%s", redact.Error(err), conn.stderrTail())
			}
			listed = append(listed, t.Name)
			if len(src.Allow) > 0 && !slices.Contains(src.Allow, t.Name) {
				continue
			}
			if !providerToolName.MatchString(t.Name) {
				if len(src.Allow) > 0 {
					return nil, permanent("MCP server %s: tool %q: a model takes tool names of 1 to 64 letters, digits, '_' or '-'", s.Name, clip(t.Name, 80))
				}
				c.d.log.Warn("MCP tool not offered: its name is not one a model takes", "mcp", s.Name, "tool", clip(t.Name, 80))
				continue
			}
			if o, ok := owner[t.Name]; ok {
				return nil, permanent("MCP server %s lists tool %s, and so does %s: the model could not tell them apart (use allow to offer one)", s.Name, t.Name, o)
			}
			if n++; n > maxMCPTools {
				return nil, permanent("MCP server %s lists over %d tools: name the ones to offer in allow", s.Name, maxMCPTools)
			}
			owner[t.Name] = "MCP server " + s.Name
			params, err := json.Marshal(t.InputSchema)
			if err != nil {
				return nil, permanent("MCP server %s: tool %s: inputSchema: %v", s.Name, t.Name, err)
			}
			out = append(out, engine.MCPTool{Server: s.Name, Name: t.Name, Description: t.Description, Parameters: params})
		}
		for _, a := range src.Allow {
			if !slices.Contains(listed, a) {
				return nil, permanent("allow names tool %s, which MCP server %s does not list (it lists: %s)", a, s.Name, clip(strings.Join(listed, ", "), 1024))
			}
		}
	}
	return out, nil
}
