package workers

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"

	"github.com/palrun/pal/internal/sandbox"
)

// EnvMCPConfig names the worker's MCP servers file (docs/architecture.md
// §14): the format desktop MCP clients read,
//
//	{"mcpServers": {"NAME": {"command": "...", "args": [...], "env": {...}}}}
//	{"mcpServers": {"NAME": {"url": "https://...", "headers": {...}}}}
//
// A stdio server (command) runs in the sandbox of process steps; an HTTP
// server (url, streamable HTTP) is reached through the egress policy. env
// and headers values may hold {{secrets.NAME}}.
const EnvMCPConfig = "PAL_MCP_CONFIG"

// Bounds of PAL_MCP_CONFIG.
const (
	// MaxMCPConfigBytes bounds the file.
	MaxMCPConfigBytes = 256 << 10
	// MaxMCPServers bounds the servers it names.
	MaxMCPServers = 64
	// maxMCPList bounds a server's args, env and headers, each.
	maxMCPList = 256
	// maxMCPValue bounds one string of a server's entry.
	maxMCPValue = 8 << 10
)

// MCPConfig is a worker's MCP servers (PAL_MCP_CONFIG).
type MCPConfig struct {
	Servers map[string]MCPServer
}

// MCPServer is one MCP server of PAL_MCP_CONFIG: Command (stdio) or URL
// (streamable HTTP).
type MCPServer struct {
	Name    string            `json:"-"`
	Type    string            `json:"type,omitempty"`
	Command string            `json:"command,omitempty"`
	Args    []string          `json:"args,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	// Network is a stdio server's network in its sandbox: "none" (the
	// default, loopback only) or "egress" (through the worker's egress
	// policy, as a process node's).
	Network string            `json:"network,omitempty"`
	URL     string            `json:"url,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`
}

// stdio reports whether the server is started by the worker.
func (s MCPServer) stdio() bool { return s.Command != "" }

// secretNames are the secrets the server's env or headers name.
func (s MCPServer) secretNames() []string {
	var out []string
	for _, m := range [...]map[string]string{s.Env, s.Headers} {
		for _, v := range m {
			for _, ref := range definedRef.FindAllStringSubmatch(v, -1) {
				if !slices.Contains(out, ref[1]) {
					out = append(out, ref[1])
				}
			}
		}
	}
	return out
}

// mcpName is the form of a server's name (as an agent's tools and a tool
// node name it).
var mcpName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// envName is the form of a variable a stdio server's env sets.
var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)

// LoadMCPConfig reads and checks the file PAL_MCP_CONFIG names; an empty
// path is no servers (nil). Errors name the setting, the server and the
// field.
func LoadMCPConfig(path string) (*MCPConfig, error) {
	if path == "" {
		return nil, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", EnvMCPConfig, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxMCPConfigBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%s=%s: %w", EnvMCPConfig, path, err)
	}
	cfg, err := ParseMCPConfig(data)
	if err != nil {
		return nil, fmt.Errorf("%s=%s: %w", EnvMCPConfig, path, err)
	}
	return cfg, nil
}

// ParseMCPConfig reads a PAL_MCP_CONFIG document: at most
// MaxMCPConfigBytes, at most MaxMCPServers servers, each a stdio server
// (command, args, env, network) or a streamable-HTTP one (url, headers),
// with no other field. Secret references may appear in env and header
// values only.
func ParseMCPConfig(data []byte) (*MCPConfig, error) {
	if len(data) > MaxMCPConfigBytes {
		return nil, fmt.Errorf("the file is over %d KiB", MaxMCPConfigBytes>>10)
	}
	var doc struct {
		Servers map[string]json.RawMessage `json:"mcpServers"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("not a JSON object {\"mcpServers\": {...}}: %v", err)
	}
	if dec.More() {
		return nil, errors.New("more than one JSON value")
	}
	if len(doc.Servers) > MaxMCPServers {
		return nil, fmt.Errorf("mcpServers: %d servers; at most %d", len(doc.Servers), MaxMCPServers)
	}
	cfg := &MCPConfig{Servers: make(map[string]MCPServer, len(doc.Servers))}
	for name, raw := range doc.Servers {
		s, err := parseMCPServer(name, raw)
		if err != nil {
			return nil, fmt.Errorf("mcpServers.%s: %w", clip(name, 64), err)
		}
		cfg.Servers[name] = s
	}
	return cfg, nil
}

func parseMCPServer(name string, raw json.RawMessage) (MCPServer, error) {
	var s MCPServer
	if !mcpName.MatchString(name) {
		return s, errors.New("the name must be 1 to 64 letters, digits, '_' or '-' (an agent's tools and a tool node name it)")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return s, fmt.Errorf("%v (want command, args, env and network, or url and headers)", err)
	}
	s.Name = name
	switch {
	case s.Command == "" && s.URL == "":
		return s, errors.New("set command (a stdio server) or url (a streamable-HTTP server)")
	case s.Command != "" && s.URL != "":
		return s, errors.New("set command or url, not both")
	}
	switch s.Type {
	case "":
	case "stdio":
		if !s.stdio() {
			return s, errors.New("type: stdio needs command")
		}
	case "http", "streamable-http", "streamableHttp":
		if s.stdio() {
			return s, fmt.Errorf("type: %s needs url", s.Type)
		}
	default:
		return s, fmt.Errorf("type: %q: want stdio or http (or leave it out)", clip(s.Type, 32))
	}
	plain := func(field, v string) error {
		if len(v) > maxMCPValue {
			return fmt.Errorf("%s: over %d bytes", field, maxMCPValue)
		}
		if definedRef.MatchString(v) {
			return fmt.Errorf("%s: secrets ({{secrets.NAME}}) go in env or headers values only", field)
		}
		return nil
	}
	values := func(field string, m map[string]string, key *regexp.Regexp) error {
		if len(m) > maxMCPList {
			return fmt.Errorf("%s: at most %d entries", field, maxMCPList)
		}
		for k, v := range m {
			if !key.MatchString(k) {
				return fmt.Errorf("%s: %q is not a valid name", field, clip(k, 64))
			}
			if len(v) > maxMCPValue {
				return fmt.Errorf("%s.%s: over %d bytes", field, k, maxMCPValue)
			}
		}
		return nil
	}
	if s.stdio() {
		if len(s.Headers) > 0 {
			return s, errors.New("headers: a stdio server (command) takes env, not headers")
		}
		if err := plain("command", s.Command); err != nil {
			return s, err
		}
		if len(s.Args) > maxMCPList {
			return s, fmt.Errorf("args: at most %d", maxMCPList)
		}
		for i, a := range s.Args {
			if err := plain(fmt.Sprintf("args[%d]", i), a); err != nil {
				return s, err
			}
		}
		if err := values("env", s.Env, envName); err != nil {
			return s, err
		}
		if s.Network != "" && s.Network != string(sandbox.NetworkNone) && s.Network != string(sandbox.NetworkEgress) {
			return s, fmt.Errorf("network: %q: want none or egress", clip(s.Network, 32))
		}
		return s, nil
	}
	if len(s.Args) > 0 || len(s.Env) > 0 || s.Network != "" {
		return s, errors.New("args, env and network are a stdio server's (command); an HTTP server (url) takes headers")
	}
	if err := plain("url", s.URL); err != nil {
		return s, err
	}
	u, err := url.Parse(s.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return s, fmt.Errorf("url: %q: want an http:// or https:// URL", clip(s.URL, 200))
	}
	if u.User != nil {
		return s, errors.New("url: no user or password in the URL; send them in headers (with {{secrets.NAME}})")
	}
	if err := values("headers", s.Headers, headerName); err != nil {
		return s, err
	}
	return s, nil
}

// headerName is the form of an HTTP header's name (a token).
var headerName = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}$")

// Names lists the configured servers, sorted.
func (c *MCPConfig) Names() []string {
	if c == nil {
		return nil
	}
	out := make([]string, 0, len(c.Servers))
	for n := range c.Servers {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// names lists the configured servers, for errors.
func (c *MCPConfig) names() string {
	if len(c.Names()) == 0 {
		return "none; set " + EnvMCPConfig
	}
	return strings.Join(c.Names(), ", ")
}
